"""`POST /v1/jobs`, `GET /v1/jobs/{id}`: asynchronous agent episodes over HTTP.

Owns the wire side of jobs: the spec is validated (and its family looked up) before the job is
stored, so a queued job can run; a full queue answers 503 with `Retry-After`; a job is visible
only to the key that created it (another key gets 404, as for a job that does not exist).
The response is the job record: status, attempts, timestamps, and once it has ended the
trajectory (`result`) or the error. Does not own running jobs (`runner`) or storing them.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from longhaul.serve.jobs.runner import JobSpec, check_spec
from longhaul.serve.openai_api.protocol import APIError, bad_request, validate
from longhaul.serve.openai_api.routes import parse_json

router = APIRouter()


def _public(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k not in ("owner", "entry")}


@router.post("/v1/jobs")
async def create_job(request: Request):
    state = request.app.state.server
    key = state.keys.authenticate(request.headers.get("authorization"))
    data = await parse_json(request, state)
    spec = validate(JobSpec, data)
    try:
        await asyncio.to_thread(check_spec, spec)  # imports a family module: off the event loop
    except ValueError as e:
        raise bad_request(str(e), "family") from None
    rec = await asyncio.to_thread(state.jobs.submit, spec.model_dump(), key.name, state.config.max_queued_jobs)
    if rec is None:
        raise APIError(503, f"the job queue is full ({state.config.max_queued_jobs} queued); retry later", type="server_overloaded",
                       code="queue_full", headers={"Retry-After": "30"})
    request.scope["state"]["log"].update(key=key.name, job=rec["id"])
    return JSONResponse(_public(rec), status_code=202)


@router.get("/v1/jobs/{job_id}")
async def get_job(request: Request, job_id: str):
    state = request.app.state.server
    key = state.keys.authenticate(request.headers.get("authorization"))
    rec = await asyncio.to_thread(state.jobs.get, job_id)
    if rec is None or rec.get("owner") != key.name:
        raise APIError(404, f"no job {job_id!r} for this key", param="job_id", code="job_not_found")
    return _public(rec)
