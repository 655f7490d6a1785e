"""A stage folder as a page a person can read: what the "Checkpoint" link opens when no object-store console
(MinIO's, AWS's) is configured, as on the embedded stack, whose S3 server answers only S3's XML.

Served by the Airflow API server (a plugin FastAPI app under /posttrain), behind Airflow's own login (the
`_token` cookie the UI sets): `/posttrain/browse?uri=s3://bucket/prefix` lists the folder (its manifest's files
with size and sha256 when it is complete, else what is stored below it), and `/posttrain/file?uri=...`
returns one object. Only URIs under POSTTRAIN_BROWSE_ROOTS (default: the run and task-set roots' bucket) are
served. It reads storage with the API server's environment (AWS_* variables, as `make up` sets them).
"""

from __future__ import annotations

import html
import mimetypes
import os
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, Response

from training import storage

PREFIX = "/posttrain"


def browse_roots() -> tuple[str, ...]:
    raw = os.environ.get("POSTTRAIN_BROWSE_ROOTS") or "s3://posttrain/"
    return tuple(r.strip() for r in raw.split(",") if r.strip())


def _allowed(uri: str) -> str:
    if ".." in uri.split("/") or not any(uri.rstrip("/") + "/" == r or uri.startswith(r) for r in browse_roots()):
        raise HTTPException(status_code=403, detail=f"{uri} is not under {', '.join(browse_roots())}")
    return uri.rstrip("/")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _link(uri: str, text: str, route: str = "browse") -> str:
    from urllib.parse import quote

    return f'<a href="{PREFIX}/{route}?uri={quote(uri, safe="")}">{html.escape(text)}</a>'


def listing_html(uri: str) -> str:
    """The page for folder `uri`: breadcrumbs, manifest state, sub-folders and files."""
    manifest = storage.read_manifest(uri)
    keys = list(storage.iter_files(uri))
    folders = sorted({k.split("/", 1)[0] for k in keys if "/" in k})
    rows: list[str] = []
    if manifest is not None:
        state = (
            f"<p class=ok>complete: manifest written {html.escape(manifest.created_at)}, git "
            f"{html.escape(manifest.git_rev[:12])}, MLflow run {html.escape(manifest.mlflow_run_id or '-')}"
            f"</p>"
        )
        files: list[tuple[str, Any]] = sorted(manifest.files.items())
        for rel, entry in files:
            rows.append(
                f"<tr><td>{_link(storage.join(uri, rel), rel, 'file')}</td><td>{_size(entry.size)}</td>"
                f"<td><code>{entry.sha256[:16]}</code></td></tr>"
            )
        rows.append(
            f"<tr><td>{_link(storage.join(uri, 'manifest.json'), 'manifest.json', 'file')}</td><td></td><td></td></tr>"
        )
    else:
        state = "<p class=warn>no manifest here: not a complete stage output (or a folder of them)</p>"
        for rel in sorted(k for k in keys if "/" not in k):
            rows.append(f"<tr><td>{_link(storage.join(uri, rel), rel, 'file')}</td><td></td><td></td></tr>")
    folder_rows = [f"<tr><td>{_link(storage.join(uri, f), f + '/')}</td><td></td><td></td></tr>" for f in folders]
    parent = uri.rsplit("/", 1)[0]
    up = _link(parent, "..") if parent.count("/") >= 2 and parent != uri else ""
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(uri)}</title><style>"
        "body{font-family:sans-serif;margin:2em}td{padding:2px 12px}code{color:#555}.ok{color:#1a7f37}"
        ".warn{color:#9a6700}</style></head><body>"
        f"<h2>{html.escape(uri)}</h2>{state}<p>{up}</p><table><tr><th align=left>name</th><th>size</th>"
        f"<th>sha256</th></tr>{''.join(folder_rows + rows)}</table></body></html>"
    )


def _user() -> Any:
    from airflow.api_fastapi.core_api.security import get_user

    return get_user


app = FastAPI(title="posttrain storage browser")


@app.get("/browse", response_class=HTMLResponse)
def browse(uri: str = Query(...), user: Any = Depends(_user())) -> HTMLResponse:
    return HTMLResponse(listing_html(_allowed(uri)))


@app.get("/file")
def file(uri: str = Query(...), user: Any = Depends(_user())) -> Response:
    uri = _allowed(uri)
    loc = storage.locate(uri)
    try:
        data = loc.backend.get_bytes(loc.key())
    except storage.StorageError as err:
        raise HTTPException(status_code=404, detail=str(err)) from err
    kind = mimetypes.guess_type(uri)[0] or "application/octet-stream"
    if kind in ("text/markdown", "application/json"):
        kind = "text/plain"  # shown in the browser rather than downloaded
    return Response(data, media_type=kind)
