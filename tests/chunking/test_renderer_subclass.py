"""A RequestRenderer subclass may set what its request_dict reads before or after super().__init__.

The base class used to render the sentinel request inside its constructor, so an attribute set
after ``super().__init__`` raised AttributeError; the split is now made on first use.
"""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow as pa

from airflow_batch_provider.chunking.requests import RequestRenderer
from airflow_batch_provider.chunking.spec import RequestSpec, renderer_for
from airflow_batch_provider.contract import SpecFields

SPEC = RequestSpec(provider="openai", model="gpt-4o-mini", params={"temperature": 0})


class SetsAfterSuper(RequestRenderer):
    provider = "openai"

    def __init__(self, spec: SpecFields) -> None:
        super().__init__(spec)
        self.tag = "after"  # read by request_dict: set only once the base constructor has returned

    def request_dict(self, custom_id: str, text: str) -> dict[str, Any]:
        return {"custom_id": custom_id, "url": self.endpoint, "body": {"tag": self.tag, "text": text}}


class SetsBeforeSuper(SetsAfterSuper):
    def __init__(self, spec: SpecFields) -> None:
        self.tag = "before"
        RequestRenderer.__init__(self, spec)


def _line(renderer: RequestRenderer, custom_id: str, text: str) -> dict[str, Any]:
    lines = renderer.lines_of(pa.array([custom_id]), pa.array([orjson.dumps(text).decode() + renderer.body_suffix]))
    return orjson.loads(lines[0].as_py())


def test_attributes_set_after_super_init_are_rendered() -> None:
    renderer = SetsAfterSuper(SPEC)
    assert _line(renderer, "r-1", "hello") == renderer.request_dict("r-1", "hello")
    assert _line(renderer, "r-1", "hello")["body"]["tag"] == "after"


def test_attributes_set_before_super_init_still_work() -> None:
    renderer = SetsBeforeSuper(SPEC)
    assert _line(renderer, "r-2", 'say "hi"') == renderer.request_dict("r-2", 'say "hi"')
    assert _line(renderer, "r-2", "x")["body"]["tag"] == "before"


def test_the_endpoint_is_the_specs_own() -> None:
    """The spec always resolves the endpoint (its backend's first when none is named): no fallback here."""
    assert SPEC.endpoint == "/v1/chat/completions"
    assert SetsAfterSuper(SPEC).endpoint == SPEC.endpoint == renderer_for(SPEC).endpoint


def test_fingerprints_do_not_depend_on_when_the_attributes_were_set() -> None:
    after, before = SetsAfterSuper(SPEC), SetsBeforeSuper(SPEC)
    before.tag = after.tag = "same"  # the split is made on first use, so this is what is rendered
    bodies = pa.array([orjson.dumps("t").decode() + after.body_suffix])
    assert after.fingerprints(bodies).to_pylist() == before.fingerprints(bodies).to_pylist()
    assert _line(before, "r", "t")["body"]["tag"] == "same"
