"""API keys: where they come from, and who a request's `Authorization: Bearer` header is.

Owns `ApiKey` (a name for logs and metrics, the key's sha256, its per-minute quotas) and
`KeyStore`: plain keys (`--api-key`, or the `LONGHAUL_API_KEY` environment variable through
the CLI) and a keys file. With no key configured the server is open and every request is
the key named "anonymous". Only digests are kept in memory. Does not own enforcing quotas
(`ratelimit`) or which routes need a key (`/health`, `/ready` and `/metrics` never do: probes
and scrapers carry no secrets).

Keys file (JSON or YAML):

    keys:
      - name: alice
        key: sk-alice-secret            # or key_sha256: <hex digest>, to keep the secret out of the file
        requests_per_minute: 60         # optional; default the server's --rpm (or unlimited)
        tokens_per_minute: 20000        # optional; prompt + generated tokens
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from longhaul.errors import LonghaulError
from longhaul.serve.openai_api.protocol import APIError


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class ApiKey:
    name: str
    sha256: str
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    @property
    def limited(self) -> bool:
        return self.requests_per_minute is not None or self.tokens_per_minute is not None


ANONYMOUS = ApiKey("anonymous", "")


def _unauthorized(message: str) -> APIError:
    return APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


class KeyStore:
    def __init__(self, keys: list[ApiKey], default_rpm: int | None = None, default_tpm: int | None = None):
        self.by_digest: dict[str, ApiKey] = {}
        for k in keys:
            if k.sha256 in self.by_digest:
                raise LonghaulError(f"API key {k.name!r} is configured twice (same secret as {self.by_digest[k.sha256].name!r}); remove one")
            self.by_digest[k.sha256] = ApiKey(k.name, k.sha256, k.requests_per_minute or default_rpm,
                                              k.tokens_per_minute or default_tpm)
        self.anonymous = ApiKey("anonymous", "", default_rpm, default_tpm)

    @property
    def enabled(self) -> bool:
        return bool(self.by_digest)

    def authenticate(self, authorization: str | None) -> ApiKey:
        """The key of an `Authorization` header value; raises a 401 APIError when keys are on
        and the header is missing or wrong."""
        if not self.enabled:
            return self.anonymous
        if not authorization:
            raise _unauthorized("You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _unauthorized("The Authorization header must be 'Bearer YOUR_KEY'.")
        key = self.by_digest.get(digest(token.strip()))
        if key is None:
            raise _unauthorized("Incorrect API key provided.")
        return key


def _parse_file(path: Path) -> list[dict]:
    if not path.is_file():
        raise LonghaulError(f"API keys file {str(path)!r} not found; pass a JSON or YAML file with a 'keys' list")
    text = path.read_text()
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as e:
        raise LonghaulError(f"API keys file {str(path)!r} does not parse ({type(e).__name__}: {e}); fix its syntax") from e
    rows = data.get("keys") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise LonghaulError(f"API keys file {str(path)!r} needs a 'keys' list of {{name, key | key_sha256, quotas}}")
    return rows


def _key_of(row, where: str) -> ApiKey:
    if not isinstance(row, dict) or not isinstance(row.get("name"), str):
        raise LonghaulError(f"{where}: each key needs a 'name'")
    secret, sha = row.get("key"), row.get("key_sha256")
    if bool(secret) == bool(sha):
        raise LonghaulError(f"{where}: key {row['name']!r} needs exactly one of 'key' and 'key_sha256'")
    quotas = {}
    for q in ("requests_per_minute", "tokens_per_minute"):
        v = row.get(q)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise LonghaulError(f"{where}: {q} of key {row['name']!r} must be a positive integer, got {v!r}")
        quotas[q] = v
    if unknown := set(row) - {"name", "key", "key_sha256", "requests_per_minute", "tokens_per_minute"}:
        raise LonghaulError(f"{where}: key {row['name']!r} has unknown fields {', '.join(sorted(unknown))}")
    return ApiKey(row["name"], digest(secret) if secret else str(sha).lower(), **quotas)


def load_keys(plain: list[str], keys_file: str | None, default_rpm: int | None = None,
              default_tpm: int | None = None) -> KeyStore:
    keys = [ApiKey(f"key-{i + 1}", digest(k)) for i, k in enumerate(k for k in plain if k)]
    if keys_file:
        keys += [_key_of(row, f"API keys file {keys_file!r}") for row in _parse_file(Path(keys_file))]
    return KeyStore(keys, default_rpm, default_tpm)
