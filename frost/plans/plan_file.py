"""The plan file: one zip with a JSON header (`plan.json`) and the kernel artifacts a plan launches.

The header says what the plan serves (the facts), how it was built (engine,
requested knobs, target record, the fingerprint of the frost that compiled it)
and lists every kernel with its full cache key and the size and sha256 of its
members. Reading checks the structure and every digest; anything unreadable
becomes a PlanFileError, never a zip or JSON error.

A plan file is data plus native code, so reading it imports nothing it names
but frost's own kernel templates and params types (`KernelRecord`'s
validators), inflates no member past the size its record declares (the zip's
own size field is compared first), and reports whether the file passes the
cache's ownership rule (`frost.compiler.trust`): only then may its kernels be
loaded.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path
from typing import Literal, NamedTuple, Optional

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from frost.compiler.compile import own_params_type_name, own_template_name
from frost.errors import PlanFileError

MAGIC = "frost-plan"
VERSION = 1
HEADER = "plan.json"
MAX_HEADER_BYTES = 64 * 2**20
MAX_MEMBER_BYTES = 1 * 2**30  # a linked library whose size the header does not record


class KernelRecord(BaseModel):
    """One kernel of the plan: what compiled it and where its bytes are in the file."""

    model_config = ConfigDict(extra="forbid")

    name: str  # the entry symbol
    template: str
    params_type: str
    params: dict
    arch: str
    key: dict  # the full cache key it was compiled under
    member: str
    size: int
    sha256: str
    so_member: Optional[str] = None  # the library linked from the object, when there is one
    so_sha256: Optional[str] = None
    so_size: Optional[int] = None
    runtime_libs: list[str] = []  # what the library was linked for (a hint: frost opens its own list)
    kernel_symbols: list[str] = []

    _own_template = field_validator("template")(classmethod(lambda cls, v: own_template_name(v)))
    _own_params_type = field_validator("params_type")(classmethod(lambda cls, v: own_params_type_name(v)))


class PlanHeader(BaseModel):
    model_config = ConfigDict(extra="forbid")

    magic: Literal["frost-plan"] = MAGIC
    version: Literal[1] = VERSION
    frost_version: str
    created: float
    graph: str
    engine: str
    knobs: dict
    target: dict
    arch: str
    fingerprint: str
    fingerprint_inputs: dict
    facts: dict
    workspace_size: int
    kernels: list[KernelRecord]


def write(path, header: PlanHeader, blobs: list[tuple[bytes, Optional[bytes]]]) -> Path:
    """Write the header and each kernel's (object, linked library or None) atomically; returns the path."""
    from frost.compiler.cache import write_atomic

    def zip_to(tmp):
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr(HEADER, header.model_dump_json(indent=1))
            for rec, (obj, so) in zip(header.kernels, blobs):
                z.writestr(rec.member, obj)
                if rec.so_member and so is not None:
                    z.writestr(rec.so_member, so)

    path = Path(path)
    write_atomic(path, zip_to, ".zip")
    return path


def _inflate(z: zipfile.ZipFile, name: str, limit: int, path) -> bytes:
    """A member's bytes, refused before inflating when the zip declares more than `limit` (zipfile never
    inflates past the declared size: a member that would is a CRC error)."""
    declared = z.getinfo(name).file_size
    if declared > limit:
        raise PlanFileError(
            f"plan file {path}: member {name} declares {declared} bytes, more than the "
            f"{limit} its record allows (corrupt or hostile file); nothing was inflated"
        )
    return z.read(name)


def _member(z: zipfile.ZipFile, name: str, size: Optional[int], digest: str, path) -> bytes:
    data = _inflate(z, name, MAX_MEMBER_BYTES if size is None else size, path)
    if (size is not None and len(data) != size) or hashlib.sha256(data).hexdigest() != digest:
        raise PlanFileError(f"plan file {path}: member {name} does not match its recorded digest (corrupt file)")
    return data


class PlanContents(NamedTuple):
    header: PlanHeader
    blobs: list  # each kernel's verified (object, linked library or None)
    untrusted: Optional[str]  # why its native code must not be loaded (trust rule), None when it may


def read(path) -> PlanContents:
    """The header, each kernel's verified (object, linked library or None) and the file's trust verdict."""
    from frost.compiler.trust import untrusted_reason

    try:
        with open(path, "rb") as f, zipfile.ZipFile(f) as z:
            untrusted = untrusted_reason(path, kind="file", fd=f.fileno())
            raw = json.loads(_inflate(z, HEADER, MAX_HEADER_BYTES, path))
            if not isinstance(raw, dict) or raw.get("magic") != MAGIC:
                raise PlanFileError(f"{path} is not a frost plan file")
            if raw.get("version") != VERSION:
                raise PlanFileError(
                    f"plan file {path} has format version {raw.get('version')!r}; this frost reads version {VERSION}"
                )
            header = PlanHeader.model_validate(raw)
            blobs = []
            for rec in header.kernels:
                obj = _member(z, rec.member, rec.size, rec.sha256, path)
                so = _member(z, rec.so_member, rec.so_size, rec.so_sha256 or "", path) if rec.so_member else None
                blobs.append((obj, so))
    except PlanFileError:
        raise
    except FileNotFoundError:
        raise PlanFileError(f"plan file {path} does not exist") from None
    except ValidationError as e:
        where = "; ".join(f"{'.'.join(map(str, er['loc']))}: {er['msg']}" for er in e.errors()[:3])
        raise PlanFileError(f"plan file {path} has a malformed header ({where})") from None
    except Exception as e:  # noqa: BLE001 - whatever a damaged zip, deflate stream or JSON raises
        raise PlanFileError(f"plan file {path} cannot be read ({type(e).__name__}: {_short(e)})") from None
    return PlanContents(header, blobs, untrusted)


def _short(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else ""
