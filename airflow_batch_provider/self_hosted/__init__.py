"""Self-hosted generation's own parts (not hooks): output lines and files, vLLM request and answer mapping.

- :mod:`.output_lines` — the OpenAI batch output lines, result files and sidecars that
  VLLMGenerateOperator and ServerGenerateOperator write (read back by ``hooks.local_results``).
- :mod:`.vllm_requests` — one OpenAI request body → vLLM's ``SamplingParams`` / prompts, row by row.
- :mod:`.vllm_answers` — one engine call per chunk, bisected around bad rows; one answer per row.
"""
