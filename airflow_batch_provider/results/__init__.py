"""Stage 4, finished batch → dataset: parse result lines, validate answers, join them onto the source rows."""
