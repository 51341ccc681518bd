"""The tasks of the FastAPI example; a worker runs them: ``conveyor worker tasks:app``."""

from __future__ import annotations

import os

import conveyor

app = conveyor.Conveyor(namespace=os.environ.get("CONVEYOR_NAMESPACE", "conveyor"))


@app.task(queue="images", retries=2, timeout=30)
async def make_thumbnail(image_id: int, width: int = 200) -> dict[str, int | str]:
    """Pretend to resize an image; returns where the thumbnail went."""
    return {"image": image_id, "width": width, "path": f"/thumbs/{image_id}-{width}.png"}


@app.task(queue="emails", retries=5, backoff=2.0)
def send_welcome(email: str) -> str:
    return f"welcome mail sent to {email}"
