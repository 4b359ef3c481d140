"""Find backends by name through the ``airflow_batch_provider.backends`` entry-point group.

Any installed distribution can add a backend with one line in its packaging metadata::

    [project.entry-points."airflow_batch_provider.backends"]
    mistral = "my_package.mistral:MistralBackend"

The three built-in backends register the same way (this package's pyproject.toml). Loading is
lazy and per name: :func:`get_backend` imports one backend's import-light module, never another's,
and no SDK (see :mod:`.base`). :func:`all_backends` loads every backend's module, for what needs
all of them at once (the built-in price table, guessing a model's provider, connection types).

SDKs are optional extras (``pip install 'airflow-batch-provider[anthropic]'``): a backend is
listed, priced and renders chunk files without its SDK, and :func:`require_sdk` (called wherever
a hook is built, :mod:`airflow_batch_provider.hooks.registry`) turns a missing one into
``AirflowOptionalProviderFeatureException`` naming what to install, before anything is uploaded.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from importlib.metadata import entry_points

from airflow_batch_provider.backends.base import Backend

ENTRY_POINT_GROUP = "airflow_batch_provider.backends"

# The built-ins, for a checkout whose installed metadata predates the entry points (an editable
# install from before they existed): the entry points in pyproject.toml say the same and win.
_BUILT_IN = {
    "openai": "airflow_batch_provider.backends.openai:OpenAIBackend",
    "anthropic": "airflow_batch_provider.backends.anthropic:AnthropicBackend",
    "bedrock": "airflow_batch_provider.backends.bedrock:BedrockBackend",
}


@functools.cache
def _targets() -> dict[str, str]:
    """Return backend name → ``"module:Class"``, from the entry points over the built-ins."""
    found = dict(_BUILT_IN)
    for point in entry_points(group=ENTRY_POINT_GROUP):
        found[point.name] = point.value
    return found


def backend_names() -> list[str]:
    """Return the names of every registered backend, sorted."""
    return sorted(_targets())


@functools.cache
def get_backend(name: str) -> Backend:
    """Return the backend registered as ``name``, importing its module now; raise for an unknown name."""
    target = _targets().get(name) if isinstance(name, str) else None
    if target is None:
        from airflow_batch_provider.exceptions import InvalidInputError  # it imports Airflow: see .base

        raise InvalidInputError(
            f"Unknown provider {name!r}; choose one of {backend_names()} "
            f"(a new one registers in the {ENTRY_POINT_GROUP!r} entry-point group: see docs/backends.md)."
        )
    module_name, _, class_name = target.partition(":")
    backend_class = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(backend_class, type) and issubclass(backend_class, Backend)):
        raise TypeError(f"Backend {name!r} = {target!r} is not a Backend subclass")
    if backend_class.name != name:
        raise TypeError(f"Backend {target!r} is registered as {name!r} but calls itself {backend_class.name!r}")
    return backend_class()


def sdk_installed(backend: Backend) -> bool:
    """Return True when ``backend`` needs no SDK or its SDK can be imported (nothing is imported)."""
    return backend.sdk_module is None or module_available(backend.sdk_module)


def require_sdk(backend: Backend) -> Backend:
    """Return ``backend`` when its SDK can be imported; else raise AirflowOptionalProviderFeatureException."""
    if sdk_installed(backend):
        return backend
    module = backend.sdk_module
    from airflow.sdk.exceptions import AirflowOptionalProviderFeatureException  # imports Airflow: see .base

    raise AirflowOptionalProviderFeatureException(
        f"The {backend.name!r} backend needs the {module!r} package, which is not installed: "
        f"pip install '{backend.sdk_requirement or module}' on every machine that runs its tasks "
        "(workers and triggerer)."
    )


def module_available(module: str) -> bool:
    """Return True when ``module`` can be imported here, without importing it (its parent packages are)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a missing parent package ("google" of "google.genai")
        return False


def find_backend(name: str) -> Backend | None:
    """Return the backend registered as ``name``, or None when there is none."""
    return get_backend(name) if isinstance(name, str) and name in _targets() else None


@functools.cache
def all_backends() -> tuple[Backend, ...]:
    """Return every registered backend, by name (imports each backend's module, no SDK)."""
    return tuple(get_backend(name) for name in backend_names())


def backend_for_model(model: str) -> Backend | None:
    """Return the backend whose model names ``model`` looks like, or None."""
    return next((backend for backend in all_backends() if backend.owns_model(model)), None)


def forget_backends() -> None:
    """Drop what was loaded, so the entry points are read again (after installing a backend at run time)."""
    _targets.cache_clear()
    get_backend.cache_clear()
    all_backends.cache_clear()
