"""Google's Gemini Batch API (Gemini Developer API) as a batch backend, through the ``google-genai`` SDK.

Every Gemini-specific piece lives in this package; the rest of the provider reaches it through
one line per registry (hook, renderer, limits, endpoint, prices, token parts, console link,
connection type). What each module owns:

- :mod:`.limits`: batch limits, key rules, the endpoint name and API version (plain data).
- :mod:`.params`: which ``params`` a request takes and their ``generationConfig`` names (checks).
- :mod:`.render`: request lines ``{custom_id, request: GenerateContentRequest}``, structured
  output through ``responseMimeType`` + ``responseJsonSchema``.
- :mod:`.states`: ``JOB_STATE_*`` → :class:`~airflow_batch_provider.status.BatchStatus` (raises on
  an unknown state), SDK ``BatchJob`` → :class:`~airflow_batch_provider.status.BatchState`, which
  SDK errors are worth a retry.
- :mod:`.results`: result lines ``{key, response | error}`` → the merged schema's records.
- :mod:`.hook`: :class:`~.hook.GeminiBatchHook` (upload, create, crash-safe re-find by display
  name, status, cancel, results download, console link).
- :mod:`.tokens`: what a request line asks the model to read, for cost estimates.
- :mod:`.prices`: list prices per model (batch mode is half of them).
- :mod:`.connection`: the ``gemini`` connection type (API key in the password field).

Nothing here is imported unless a Gemini chunk or batch is handled, so the SDK stays optional
(the ``gemini`` extra).
"""
