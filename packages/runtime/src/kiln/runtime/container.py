"""The two physical forms of an artifact: a directory, or a single zip file (same names inside).

Writes are atomic (a temporary sibling, then ``os.replace``), so a crash never leaves half an
artifact under the final name. Reads turn every I/O or format problem into an ``ArtifactError``.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import tempfile
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

from .errors import ArtifactError
from .manifest import MANIFEST_NAME

_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
PathLike = str | os.PathLike


def check_file_name(name: str) -> None:
    if not _SAFE_NAME.match(name) or any(part in (".", "..") for part in name.split("/")) \
            or name == MANIFEST_NAME:
        raise ArtifactError(f"invalid artifact file name {name!r}: use relative names of letters, "
                            "digits, '_', '-', '.' and '/' (and not 'manifest.json')")


def choose_format(path: PathLike | BinaryIO, fmt: str) -> str:
    if fmt in ("dir", "zip"):
        return fmt
    if fmt != "auto":
        raise ValueError(f"format must be 'auto', 'dir' or 'zip', not {fmt!r}")
    if not isinstance(path, (str, os.PathLike)):
        return "zip"
    p = os.fspath(path)
    return "dir" if os.path.isdir(p) or p.endswith(os.sep) else "zip"


def zip_bytes(manifest: bytes, files: Mapping[str, bytes]) -> bytes:
    """The zip form. Entries are stored, not deflated (as torch.save's zip files): a load would
    inflate them (a mobilenet's manifest is 270 KB) while a new machine waits for its first call.
    Older, deflated artifacts read as before."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr(MANIFEST_NAME, manifest)
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


def write_container(path: PathLike | BinaryIO, manifest: bytes, files: Mapping[str, bytes],
                    fmt: str) -> None:
    fmt = choose_format(path, fmt)
    if not isinstance(path, (str, os.PathLike)):
        path.write(zip_bytes(manifest, files))
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "zip":
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(zip_bytes(manifest, files))
            os.replace(tmp, target)
        except BaseException:
            _remove(Path(tmp))
            raise
        return
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        for name, data in files.items():
            (tmp_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_dir / name).write_bytes(data)
        (tmp_dir / MANIFEST_NAME).write_bytes(manifest)  # last: a directory with a manifest is whole
        if target.exists():
            _remove(target)
        os.replace(tmp_dir, target)
    except BaseException:
        _remove(tmp_dir)
        raise


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        try:
            p.unlink()
        except OSError:
            pass


class Container:
    """Read access to the files of one artifact; ``directory`` is set for directory artifacts."""

    def __init__(self, location: str, *, directory: Path | None = None,
                 archive: zipfile.ZipFile | None = None) -> None:
        self.location = location
        self.directory = directory
        self._zip = archive

    def read(self, name: str) -> bytes:
        try:
            if self._zip is not None:
                return self._zip.read(name)
            assert self.directory is not None
            return (self.directory / name).read_bytes()
        except KeyError:
            raise ArtifactError(f"artifact {self.location} is missing file {name!r} listed in its "
                                "manifest (truncated or incomplete copy?)") from None
        except FileNotFoundError:
            raise ArtifactError(f"artifact {self.location} is missing file {name!r} listed in its "
                                "manifest (truncated or incomplete copy?)") from None
        # ValueError: bad offsets; NotImplementedError: a corrupt header naming an unknown zip version/method
        except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, NotImplementedError) as e:
            raise ArtifactError(f"artifact {self.location}: file {name!r} is corrupt in the zip "
                                f"archive ({e})") from e
        except OSError as e:
            raise ArtifactError(f"artifact {self.location}: cannot read {name!r}: {e}") from e


def open_container(source: PathLike | BinaryIO | bytes) -> Container:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _open_zip(io.BytesIO(bytes(source)), "<bytes>")
    if not isinstance(source, (str, os.PathLike)):
        data = source.read()
        name = getattr(source, "name", "<file object>")
        return _open_zip(io.BytesIO(data), str(name))
    path = Path(source)
    if path.is_dir():
        if not (path / MANIFEST_NAME).is_file():
            raise ArtifactError(f"{path} is not a kiln artifact: the directory has no {MANIFEST_NAME}")
        return Container(str(path), directory=path)
    if not path.exists():
        raise ArtifactError(f"no artifact at {path}: the file does not exist")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ArtifactError(f"cannot read artifact {path}: {e}") from e
    return _open_zip(io.BytesIO(data), str(path))


def _open_zip(buf: io.BytesIO, location: str) -> Container:
    try:
        # artifact names are ASCII (check_file_name): decoding them as UTF-8 reads them as cp437
        # would, without importing the cp437 codec (~0.3 ms of a new process's load)
        archive = zipfile.ZipFile(buf, metadata_encoding="utf-8")
    except (zipfile.BadZipFile, NotImplementedError, UnicodeDecodeError) as e:  # a corrupt header can name an unknown zip version
        size = len(buf.getvalue())
        raise ArtifactError(f"artifact {location} is not a valid kiln artifact: bad zip file ({e}; "
                            f"{size} bytes) — it is truncated, corrupt, or not an artifact") from e
    if MANIFEST_NAME not in archive.namelist():
        raise ArtifactError(f"{location} is a zip file but not a kiln artifact: it has no "
                            f"{MANIFEST_NAME}")
    return Container(location, archive=archive)
