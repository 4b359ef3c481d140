"""Input checks of the chunk step that neither the table readers nor the provider make for us.

- :func:`check_model_endpoint`: a model whose *name* says it cannot serve the endpoint.

Each raises :class:`~airflow_batch_provider.exceptions.InvalidInputError` naming the row, line or
model at fault and what to do, before anything is written or uploaded.
"""

from __future__ import annotations

import re

from airflow_batch_provider.exceptions import InvalidInputError

# ------------------------------------------------------------------------------ model vs endpoint

_EMBEDDINGS = "/v1/embeddings"
# Names of chat (text-generation) model families that have no embeddings, with an optional
# fine-tune prefix: gpt-4o-mini, chatgpt-4o-latest, o1, o3-mini, o4-mini, claude-haiku-4-5, ft:gpt-4o:...
_CHAT_MODEL = re.compile(r"^(?:ft:)?(?:gpt-|chatgpt-|o\d+(?:-|:|$)|claude-)", re.IGNORECASE)


def check_model_endpoint(model: str, endpoint: str) -> None:
    """Raise InvalidInputError when ``model``'s name says it cannot serve ``endpoint``.

    The rule is deliberately small, so no working setup is refused:

    - a name containing ``embed`` (``text-embedding-3-small``, ``nomic-embed-text``,
      ``Qwen3-Embedding-8B``) is an embedding model: refused on every endpoint but ``/v1/embeddings``;
    - a name of a known chat family (``gpt-*``, ``chatgpt-*``, ``o1``/``o3-*``/``o4-*``,
      ``claude-*``, optionally behind ``ft:``) that does not contain ``embed`` is refused on
      ``/v1/embeddings``.

    Any other name (self-hosted models, fine-tunes, aliases) is accepted on every endpoint.
    """
    is_embedding = "embed" in model.lower()
    if endpoint == _EMBEDDINGS:
        if not is_embedding and _CHAT_MODEL.match(model):
            raise InvalidInputError(
                f"Model {model!r} is a chat model and cannot serve {_EMBEDDINGS}. Use an embedding model "
                "(e.g. 'text-embedding-3-small'), or endpoint='/v1/chat/completions' for chat requests."
            )
    elif is_embedding:
        raise InvalidInputError(
            f"Model {model!r} is an embedding model (its name contains 'embed') and cannot serve {endpoint}. "
            f"Use endpoint={_EMBEDDINGS!r} (provider 'openai') to compute embeddings, or a chat model "
            f"(e.g. 'gpt-4o-mini') for {endpoint}."
        )
