"""A fake Hugging Face Hub on 127.0.0.1 for tests: the subset of the API that huggingface_hub 2.x uses to
download a model, found by reading huggingface_hub (hf_api.model_info / list_repo_tree, file_download) and by
watching its requests.

- `GET /api/models/{repo}[/revision/{rev}][?blobs=True]` → repo info: `sha` and `siblings`
  (`rfilename`, and with blobs: `size`, `blobId`, `lfs` {`sha256`, `size`, `pointerSize`}).
- `GET /api/models/{repo}/tree/{rev}[/{path}][?recursive=True]` → files (`type`, `path`, `size`, `oid`, `lfs`
  {`oid`, `size`, `pointerSize`}) and folders, one page.
- `HEAD|GET /{repo}/resolve/{rev}/{path}` → small files: 200 with `ETag` (git blob sha1), `X-Repo-Commit`,
  `Content-Length`; LFS files (`*.safetensors`): 302 to a second origin (the "CDN") with `X-Linked-Etag` (sha256),
  `X-Linked-Size`, `X-Repo-Commit`, as the Hub does.
- `GET /cdn/{sha256}` on the CDN origin, honouring `Range: bytes=N-` (206 + `Content-Range`); a blob listed in
  `drop_once` is cut off mid-body (the connection closes) the first time it is fetched.
- Errors as the Hub sends them: 404 + `X-Error-Code: RepoNotFound | RevisionNotFound | EntryNotFound`;
  401 + `X-Error-Code: RepoNotFound` without a token for a private repo, 401 "Invalid credentials in
  Authorization header" with a wrong one.
Every request is recorded in `requests` as (origin, method, path, Range header).
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    sha = hashlib.sha256(data).hexdigest()
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(data)}\n".encode()


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str
    token: str | None = None  # private repo: requests need "Authorization: Bearer <token>"
    reported_sizes: dict[str, int] = field(default_factory=dict)  # sizes to announce instead of the real ones

    def is_lfs(self, path: str) -> bool:
        return path.endswith(".safetensors")

    def entry(self, path: str) -> dict:
        data = self.files[path]
        size = self.reported_sizes.get(path, len(data))
        if not self.is_lfs(path):
            return {"size": size, "blob_id": git_blob_sha1(data)}
        pointer = lfs_pointer(data)
        return {"size": size, "blob_id": git_blob_sha1(pointer), "sha256": hashlib.sha256(data).hexdigest(),
                "pointer_size": len(pointer)}


class FakeHub:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.blobs: dict[str, bytes] = {}  # sha256 → content, served by the CDN origin
        self.drop_once: set[str] = set()
        self.requests: list[tuple[str, str, str, str | None]] = []
        self._lock = threading.Lock()
        self.hub = ThreadingHTTPServer(("127.0.0.1", 0), self._handler("hub"))
        self.cdn = ThreadingHTTPServer(("127.0.0.1", 0), self._handler("cdn"))
        for server in (self.hub, self.cdn):
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.hub.server_address[1]}"

    @property
    def cdn_origin(self) -> str:
        return f"http://127.0.0.1:{self.cdn.server_address[1]}"

    def add_repo(self, repo_id: str, files: dict[str, bytes], **kw) -> str:
        """Serve `files` as `repo_id` at a commit derived from their contents (also as branch main)."""
        commit = hashlib.sha1(repo_id.encode() + b"".join(sorted(files.values()))).hexdigest()
        repo = Repo(files, commit, **kw)
        self.repos[repo_id] = repo
        for path, data in files.items():
            if repo.is_lfs(path):
                self.blobs[hashlib.sha256(data).hexdigest()] = data
        return commit

    def add_folder(self, repo_id: str, folder: Path, **kw) -> str:
        files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        return self.add_repo(repo_id, files, **kw)

    def paths(self, origin: str = "hub", method: str | None = None) -> list[str]:
        with self._lock:
            return [p for o, m, p, _ in self.requests if o == origin and (method is None or m == method)]

    def close(self) -> None:
        for server in (self.hub, self.cdn):
            server.shutdown()
            server.server_close()

    def _handler(self, origin: str):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self._route("HEAD")

            def do_GET(self):
                self._route("GET")

            def _route(self, method: str):
                url = urlsplit(self.path)
                with hub._lock:
                    hub.requests.append((origin, method, self.path, self.headers.get("Range")))
                parts = [unquote(p) for p in url.path.split("/")[1:]]
                if origin == "cdn":
                    return self._cdn(method, parts)
                if parts[:2] == ["api", "models"] and len(parts) >= 4:
                    return self._api(parts[2] + "/" + parts[3], parts[4:], parse_qs(url.query))
                if len(parts) >= 5 and parts[2] == "resolve":
                    return self._resolve(method, parts[0] + "/" + parts[1], parts[3], "/".join(parts[4:]))
                self._error(404, "RepoNotFound", "not found")

            # -- helpers
            def _send(self, status: int, headers: dict, body: bytes = b"", method: str = "GET"):
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, str(v))
                self.end_headers()
                if method != "HEAD" and body:
                    self.wfile.write(body)

            def _error(self, status: int, code: str | None, message: str, commit: str | None = None):
                headers = {"Content-Type": "application/json", "X-Error-Message": message}
                if code:
                    headers["X-Error-Code"] = code
                if commit:
                    headers["X-Repo-Commit"] = commit
                body = json.dumps({"error": message}).encode()
                self._send(status, {**headers, "Content-Length": len(body)}, body)

            def _repo(self, repo_id: str, rev: str) -> Repo | None:
                repo = hub.repos.get(repo_id)
                if repo is None:
                    self._error(404, "RepoNotFound", "Repository not found")
                    return None
                if repo.token is not None:
                    auth = self.headers.get("Authorization")
                    if auth is None:
                        self._error(401, "RepoNotFound", "Invalid username or password.")
                        return None
                    if auth != f"Bearer {repo.token}":
                        self._error(401, None, "Invalid credentials in Authorization header")
                        return None
                if rev not in ("main", repo.commit):
                    self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                    return None
                return repo

            def _json(self, obj):
                body = json.dumps(obj).encode()
                self._send(200, {"Content-Type": "application/json", "Content-Length": len(body)}, body)

            # -- /api/models/...
            def _api(self, repo_id: str, rest: list[str], query: dict):
                if not rest or rest[0] == "revision":
                    repo = self._repo(repo_id, rest[1] if len(rest) > 1 else "main")
                    if repo:
                        blobs = query.get("blobs", ["false"])[0].lower() == "true"
                        self._json({"_id": "0" * 24, "id": repo_id, "modelId": repo_id, "sha": repo.commit,
                                    "private": repo.token is not None, "tags": [],
                                    "siblings": [self._sibling(repo, p, blobs) for p in sorted(repo.files)]})
                elif rest[0] == "tree" and len(rest) >= 2:
                    repo = self._repo(repo_id, rest[1])
                    if repo:
                        self._json(self._tree(repo, "/".join(rest[2:])))
                else:
                    self._error(404, None, "not found")

            def _sibling(self, repo: Repo, path: str, blobs: bool) -> dict:
                if not blobs:
                    return {"rfilename": path}
                e = repo.entry(path)
                s = {"rfilename": path, "size": e["size"], "blobId": e["blob_id"]}
                if "sha256" in e:
                    s["lfs"] = {"sha256": e["sha256"], "size": e["size"], "pointerSize": e["pointer_size"]}
                return s

            def _tree(self, repo: Repo, prefix: str) -> list[dict]:
                out, folders = [], set()
                for path in sorted(repo.files):
                    if prefix and not path.startswith(prefix + "/"):
                        continue
                    parent = path.rpartition("/")[0]
                    while parent and parent != prefix and parent not in folders:
                        folders.add(parent)
                        out.append({"type": "directory", "oid": git_blob_sha1(parent.encode()), "path": parent,
                                    "size": 0})
                        parent = parent.rpartition("/")[0]
                    e = repo.entry(path)
                    item = {"type": "file", "oid": e["blob_id"], "size": e["size"], "path": path}
                    if "sha256" in e:
                        item["lfs"] = {"oid": e["sha256"], "size": e["size"], "pointerSize": e["pointer_size"]}
                    out.append(item)
                return out

            # -- /{repo}/resolve/{rev}/{path}
            def _resolve(self, method: str, repo_id: str, rev: str, path: str):
                repo = self._repo(repo_id, rev)
                if repo is None:
                    return
                if path not in repo.files:
                    return self._error(404, "EntryNotFound", f"{path} does not exist", commit=repo.commit)
                data, e = repo.files[path], repo.entry(path)
                if "sha256" in e:
                    self._send(302, {
                        "Location": f"{hub.cdn_origin}/cdn/{quote(e['sha256'])}",
                        "ETag": f'"{e["blob_id"]}"',
                        "X-Linked-Etag": f'"{e["sha256"]}"',
                        "X-Linked-Size": e["size"],
                        "X-Repo-Commit": repo.commit,
                        "Content-Length": 0,
                    }, method=method)
                else:
                    self._send(200, {"ETag": f'"{e["blob_id"]}"', "X-Repo-Commit": repo.commit,
                                     "Content-Length": len(data), "Content-Type": "application/octet-stream"},
                               data, method)

            # -- CDN: /cdn/{sha256}
            def _cdn(self, method: str, parts: list[str]):
                data = hub.blobs.get(parts[1]) if len(parts) == 2 and parts[0] == "cdn" else None
                if data is None:
                    return self._error(404, None, "no such blob")
                start, status, headers = 0, 200, {"ETag": f'"{parts[1]}"', "Accept-Ranges": "bytes"}
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes=") and rng[6:].endswith("-"):
                    start, status = int(rng[6:-1]), 206
                    headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                body = data[start:]
                headers["Content-Length"] = len(body)
                if method == "GET" and start == 0 and parts[1] in hub.drop_once:
                    hub.drop_once.discard(parts[1])
                    self._send(200, headers, body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self._send(status, headers, body, method)

        return Handler
