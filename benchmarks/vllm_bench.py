"""``make bench-vllm``: VLLMGenerateOperator's throughput against raw ``LLM.chat`` on one engine, interleaved.

vLLM's CPU build and the tiny random model (:mod:`benchmarks.tiny_model`): the same prompts, the same
sampling settings (greedy, ``max_tokens`` fixed, EOS ignored so that both sides generate the same
number of tokens) and ONE engine, built once. Rounds run raw ``llm.chat(conversations,
params)`` and the operator's whole task, in alternating order (read the chunk file, build each row's ``SamplingParams``,
check prompt lengths, one ``llm.chat``, write the output lines and the sidecar); the operator gets the
shared engine through a factory whose shutdown leaves it running. Last line::

    vllm: rows=… operator_tok_s=… raw_tok_s=… ratio=…

Before it: ``vllm: load_first_s=… load_again_s=…`` — an engine's build time in a fresh process and a
second build in the same one, what a task pays per chunk (docs/self_hosted.md, "Engine reuse").
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.tiny_model import ENGINE_ARGS, build_tiny_model, cpu_engine_env

MAX_TOKENS = 8


class _Kept:
    """The shared ``LLM`` as the operator sees it: everything delegated, ``shutdown`` leaves it running."""

    llm_engine = None  # no engine-core shutdown either

    def __init__(self, llm: Any) -> None:
        self._llm = llm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)

    def shutdown(self) -> None:
        """Keep the engine for the next round."""


def _chunk(folder: Path, rows: int) -> dict[str, Any]:
    from tests.support import write_chunk

    lines = [
        {
            "custom_id": f"r-{i:05d}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "tiny",
                "messages": [
                    {"role": "system", "content": "You classify products."},
                    {"role": "user", "content": f"Product number {i}: red cotton shirt, size {i % 7}"},
                ],
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "ignore_eos": True,
            },
        }
        for i in range(rows)
    ]
    table = [{"custom_id": line["custom_id"], "text": ""} for line in lines]
    return dict(write_chunk(folder, table, lines=lines, model="tiny"))


def main() -> None:
    """Build the engine once, run raw and operator rounds interleaved, print the comparison line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=int(os.environ.get("BENCH_VLLM_ROWS", "2000")))
    parser.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_VLLM_ROUNDS", "4")))
    args = parser.parse_args()
    os.environ.update(cpu_engine_env())
    from airflow_batch_provider.hooks import vllm_engine
    from airflow_batch_provider.operators.vllm import VLLMGenerateOperator
    from tests.support import make_context

    work = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    model = str(build_tiny_model(Path(".demo") / "tiny-llama"))
    # What a task pays per chunk: the first build in a process, then (after a shutdown) a second one.
    # Only one engine lives at a time: a shutdown tears down the process's distributed state.
    started = time.monotonic()
    vllm_engine.shutdown_engine(vllm_engine.load_engine(model=model, **ENGINE_ARGS))
    load_first = time.monotonic() - started
    started = time.monotonic()
    engine = vllm_engine.load_engine(model=model, **ENGINE_ARGS)
    load_again = time.monotonic() - started
    print(f"vllm: load_first_s={load_first:.1f} load_again_s={load_again:.1f}", flush=True)

    def shared(**_: Any) -> Any:
        kept = vllm_engine.describe_llm(_Kept(engine.llm), engine.classes)
        kept.cleanup = lambda: None
        return kept

    vllm_engine.create_engine = shared  # type: ignore[assignment]
    chunk = _chunk(work, args.rows)
    conversations = [line for line in _bodies(chunk)]
    # One SamplingParams per row, as the operator sends them, built before the clock starts: the raw side's
    # best case (its work outside llm.chat is not timed at all).
    params = [
        engine.classes.sampling_params(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True) for _ in conversations
    ]
    totals = {"raw": [0, 0.0], "operator": [0, 0.0]}

    def raw() -> None:
        started = time.monotonic()
        outputs = engine.llm.chat(conversations, sampling_params=params, use_tqdm=False)
        totals["raw"][1] += time.monotonic() - started
        totals["raw"][0] += sum(len(o.outputs[0].token_ids) for o in outputs)

    def operator() -> None:
        op = VLLMGenerateOperator(task_id="bench", chunk=chunk, model=model, overwrite=True)
        started = time.monotonic()
        result = op.execute(make_context())
        totals["operator"][1] += time.monotonic() - started
        totals["operator"][0] += result["generation"]["output_tokens"]

    for round_ in range(args.rounds):
        # Alternate which side goes first, so that neither always meets a colder (or busier) machine.
        for run in (raw, operator) if round_ % 2 == 0 else (operator, raw):
            run()
        print(
            f"vllm: round {round_ + 1}: raw {totals['raw'][1]:.1f} s, "
            f"operator {totals['operator'][1]:.1f} s (cumulative)"
        )
    raw_tok_s = totals["raw"][0] / totals["raw"][1]
    op_tok_s = totals["operator"][0] / totals["operator"][1]
    vllm_engine.shutdown_engine(engine)
    print(
        f"vllm: rows={args.rows} operator_tok_s={op_tok_s:.1f} raw_tok_s={raw_tok_s:.1f} "
        f"ratio={op_tok_s / raw_tok_s:.3f}"
    )


def _bodies(chunk: dict[str, Any]) -> list[Any]:
    import orjson

    with open(chunk["requests_path"], "rb") as handle:
        return [orjson.loads(line)["body"]["messages"] for line in handle]


if __name__ == "__main__":
    main()
