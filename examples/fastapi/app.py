"""A FastAPI app that enqueues jobs from requests and reports their state.

Run: ``uvicorn app:api`` and, beside it, ``conveyor worker tasks:app``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel
from tasks import app, make_thumbnail, send_welcome

import conveyor

api = FastAPI(title="conveyor example")


class Signup(BaseModel):
    email: str


@api.post("/signup", status_code=202)
async def signup(body: Signup) -> dict[str, str]:
    job = await send_welcome.aenqueue(body.email)  # stored in Redis when this returns
    return {"job": job.id}


@api.post("/images/{image_id}/thumbnail", status_code=202)
async def thumbnail(image_id: int, width: int = 200) -> dict[str, str]:
    job = await make_thumbnail.options(key=f"thumb-{image_id}-{width}").aenqueue(image_id, width)
    return {"job": job.id}


@api.get("/jobs/{job_id}")
async def job_state(job_id: str) -> dict[str, Any]:
    try:
        info = await app.job(job_id).ainfo()
    except (conveyor.JobNotFound, ValueError):
        raise HTTPException(404, f"no job {job_id}") from None
    return {"id": info.id, "state": info.state.value, "attempts": info.attempts,
            "result": info.result, "error": info.error}
