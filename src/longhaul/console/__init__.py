"""`longhaul console`: a local web app over the runs directory.

Shows every run under `runs/` (status inferred from its files), a run's metrics as live curves
(read incrementally, so a page never fetches the whole history twice), its config, its
evaluation table and its episodes turn by turn, untruncated. Modules: `paths` (what may be
read: nothing outside the runs directory), `jsonl` (append-only JSONL files indexed as they
grow), `runs` (a run's summary, config and evaluation), `episodes` (episode files as turns),
`environments` (the envcheck manifest), `playground` (chats relayed to an OpenAI-compatible
server given by `--serve`), `app` (the FastAPI routes, the token check, `run_console`). The pages
are static files in `static/`; the charts are uPlot, vendored by `make console`.

It reads runs and never writes them; it starts no training and serves no model (that is
`longhaul serve`). FastAPI and uvicorn are the `serve` extra, imported by `app` only.
"""
