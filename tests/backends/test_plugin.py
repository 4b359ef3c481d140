"""A backend from another distribution plugs in through the entry-point group, like the built-in ones.

The outside distribution is real packaging metadata: a ``*.dist-info`` folder with an
``entry_points.txt`` on ``sys.path``, which ``importlib.metadata`` finds as it finds an installed
wheel. Nothing of the pipeline is told about it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_batch_provider.backends.registry import (
    ENTRY_POINT_GROUP,
    backend_names,
    find_backend,
    forget_backends,
    get_backend,
)
from airflow_batch_provider.chunking.spec import RequestSpec, renderer_for
from airflow_batch_provider.cost.pricing import default_pricing
from airflow_batch_provider.cost.tokens import TokenCounter, count_request_tokens, provider_of
from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.get_provider_info import get_provider_info
from airflow_batch_provider.hooks.registry import hook_class_for
from airflow_batch_provider.links import console_url
from tests.support import write_distribution

TOY_BACKEND = '''
"""A toy backend: {custom_id, prompt} lines; 10 requests a batch."""
from airflow_batch_provider.backends.base import Backend, CountableRequest, TokenRules
from airflow_batch_provider.chunking.limits import ProviderLimits


class ToyBackend(Backend):
    name = "toy"
    title = "Toy Batch"
    limits = ProviderLimits("toy", max_requests=10, max_bytes=10_000, default_byte_cap=9_000,
                            endpoints=frozenset({"/toy"}), min_requests=2)
    endpoints = ("/toy",)
    hook_class_path = "toy_backend.hook:ToyHook"
    connection_type = "toy_batch"
    model_prefixes = ("toy-",)
    prices = {"toy-1": (1.0, 2.0)}
    batch_discount = 0.25
    console_hosts = ("api.toy.example",)
    console_template = "https://console.toy.example/b/{batch_id}"

    def check_params(self, spec):
        from airflow_batch_provider.exceptions import InvalidInputError

        if "temperature" in spec.params:
            raise InvalidInputError("Toy models take no temperature.")

    def renderer(self, spec):
        from toy_backend.requests import ToyRenderer

        return ToyRenderer(spec)

    def parse_result(self, line):
        raise NotImplementedError

    def token_rules(self, model):
        return TokenRules(chars_per_token=2.0)

    def countable_request(self, line):
        ask = line.get("ask")
        if not isinstance(ask, dict):
            return None
        return CountableRequest({"prompt": [ask["text"]], "max_tokens": ask["limit"]}, typical_answer="yes")
'''

TOY_RENDERER = """
from airflow_batch_provider.chunking.requests import RequestRenderer


class ToyRenderer(RequestRenderer):
    provider = "toy"

    def request_dict(self, custom_id, text):
        return {"custom_id": custom_id, "model": self.spec.model, "ask": {"text": text, "limit": 8}}
"""

TOY_HOOK = """
from airflow_batch_provider.hooks.base import BatchHook


class ToyHook(BatchHook):
    provider = "toy"
    default_conn_name = "toy_default"
    conn_type = "toy_batch"
    hook_name = "Toy Batch"

    def create_batch(self, chunk, *, input_file_id, metadata):
        raise NotImplementedError

    def get_state(self, batch_id):
        raise NotImplementedError

    async def aget_state(self, batch_id):
        raise NotImplementedError

    def cancel(self, batch_id):
        raise NotImplementedError

    def iter_results(self, state):
        raise NotImplementedError
"""


def install_toy(root: Path) -> None:
    """Write the toy backend's package and its distribution metadata (as a wheel install would) under ``root``."""
    package = root / "toy_backend"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(TOY_BACKEND))
    (package / "requests.py").write_text(textwrap.dedent(TOY_RENDERER))
    (package / "hook.py").write_text(textwrap.dedent(TOY_HOOK))
    write_distribution(root, "toy-backend", {ENTRY_POINT_GROUP: {"toy": "toy_backend:ToyBackend"}})


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    install_toy(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    forget_backends()
    yield
    forget_backends()
    for name in [m for m in sys.modules if m == "toy_backend" or m.startswith("toy_backend.")]:
        del sys.modules[name]


def test_the_built_in_backends_register_through_the_entry_point_group():
    from importlib.metadata import entry_points

    """Every backend package of this repository has its line in the group (no list to keep in step here)."""
    registered = {point.name: point.value for point in entry_points(group=ENTRY_POINT_GROUP)}
    folder = Path(get_backend("openai").__module__.replace(".", "/")).parent  # airflow_batch_provider/backends
    packages = {p.name for p in (Path(__file__).parents[2] / folder).iterdir() if (p / "__init__.py").is_file()}
    assert {"openai", "anthropic", "bedrock", "gemini", "azure"} <= packages
    for name in packages:
        assert registered[name].startswith(f"airflow_batch_provider.backends.{name}:"), name
        assert get_backend(name).name == name


@pytest.mark.usefixtures("toy")
def test_an_outside_backend_serves_every_stage_without_touching_the_pipeline():
    assert "toy" in backend_names()
    spec = RequestSpec(provider="toy", model="toy-1")
    assert spec.endpoint == "/toy" and spec.limits.max_requests == 10 and spec.limits.min_requests == 2
    with pytest.raises(InvalidInputError, match="Toy models take no temperature"):
        RequestSpec(provider="toy", model="toy-1", params={"temperature": 0.5})
    renderer = renderer_for(spec)
    line = renderer.request_dict("r1", "hello!")
    assert line == {"custom_id": "r1", "model": "toy-1", "ask": {"text": "hello!", "limit": 8}}
    tally = count_request_tokens([line], "toy-1")  # the backend's line format, its 2 chars a token
    assert (tally.input_tokens, tally.output_tokens, tally.expected_output_tokens) == (3, 8, 2)
    # Not imported until a hook is asked for: choosing a backend imports no SDK.
    assert "toy_backend.hook" not in sys.modules
    assert hook_class_for("toy").__module__ == "toy_backend.hook"
    price = default_pricing().lookup("toy-1")
    assert (price.provider, price.batch_input_per_mtok, price.batch_output_per_mtok) == ("toy", 0.75, 1.5)
    assert provider_of("toy-1") == "toy" and TokenCounter("toy-1").count("abcdef") == 3
    assert console_url("toy", "https://api.toy.example/v1", "b-1") == "https://console.toy.example/b/b-1"
    assert console_url("toy", "http://127.0.0.1:8089", "b-1") is None
    info = get_provider_info()
    (toy_conn,) = [c for c in info["connection-types"] if c["connection-type"] == "toy_batch"]
    assert toy_conn["hook-class-name"] == "toy_backend.hook.ToyHook"
    assert "toy_backend.hook" in info["hooks"][0]["python-modules"]


def test_without_the_distribution_the_backend_is_gone(toy):
    assert find_backend("toy") is not None
    forget_backends()
    sys.path.remove(next(p for p in sys.path if Path(p, "toy_backend").is_dir()))
    assert find_backend("toy") is None


@pytest.mark.parametrize("params", [{}, {"max_tokens": 5}])
def test_an_unknown_provider_gets_a_clear_error_not_another_backends_checks(params):
    with pytest.raises(InvalidInputError) as caught:
        RequestSpec(provider="vertex", model="gemini-x", params=params)
    message = str(caught.value)
    assert "Unknown provider 'vertex'" in message and all(f"'{name}'" in message for name in backend_names())
    assert "max_tokens" not in message
    with pytest.raises(InvalidInputError, match="Unknown provider 'vertex'"):
        get_backend("vertex")


def test_a_backend_registered_under_another_name_is_refused(tmp_path, monkeypatch):
    install_toy(tmp_path)
    metadata = tmp_path / "toy_backend-0.1.dist-info" / "entry_points.txt"
    metadata.write_text(f"[{ENTRY_POINT_GROUP}]\nplaything = toy_backend:ToyBackend\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    forget_backends()
    try:
        with pytest.raises(TypeError, match="registered as 'plaything' but calls itself 'toy'"):
            get_backend("plaything")
    finally:
        forget_backends()
        sys.modules.pop("toy_backend", None)


def test_choosing_one_backend_imports_no_other_backends_sdk():
    """Chunk, render and load the hook for Anthropic: no other SDK (openai, boto3, google-genai) is imported."""
    code = (
        "import sys\n"
        "from airflow_batch_provider.chunking.spec import RequestSpec, renderer_for\n"
        "from airflow_batch_provider.cost.pricing import default_pricing\n"
        "from airflow_batch_provider.hooks.registry import hook_class_for\n"
        "spec = RequestSpec(provider='anthropic', model='claude-haiku-4-5', params={'max_tokens': 5})\n"
        "renderer_for(spec).request_dict('a', 'b')\n"
        "default_pricing()\n"
        "hook_class_for('anthropic')\n"
        "print(sorted(m for m in ('anthropic', 'openai', 'boto3', 'botocore', 'google.genai') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip().splitlines()[-1] == "['anthropic']"
