"""`tunesmith webui`: a local web page to build and launch training runs, watch them, compare them, chat with
their checkpoints and export them.

One FastAPI app (app.py) serves a static page (static/) and a JSON API; each concern has its own module:
auth (the access token), form (the config schema as a form), configs (validation, YAML import and export),
runs (what an output root holds, read as it is written), launcher (training subprocesses), chat and
exporter (checkpoints). server.py starts it under uvicorn.
"""
