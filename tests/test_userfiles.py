"""userfiles.check_writable: the one check that an output file can be written, made
before a long job (training the DNN, a simulation) rather than after it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from elastico_extender.userfiles import check_writable, reason


def test_a_new_file_in_a_folder_that_takes_files_passes_and_is_not_left_behind(
    tmp_path: Path,
) -> None:
    check_writable(tmp_path / "model.onnx")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_file_passes_untouched(tmp_path: Path) -> None:
    out = tmp_path / "model.onnx"
    out.write_bytes(b"weights")
    check_writable(out)
    assert out.read_bytes() == b"weights"


@pytest.mark.parametrize("kind", ["folder", "fifo", "dangling-link", "missing-parent"])
def test_what_cannot_be_written_as_a_file_is_an_oserror_saying_why(
    tmp_path: Path, kind: str
) -> None:
    out = tmp_path / "out"
    if kind == "folder":
        out.mkdir()
    elif kind == "fifo":
        os.mkfifo(out)  # opening it to write would wait for a reader
    elif kind == "dangling-link":
        out.symlink_to(tmp_path / "nowhere")
    else:
        out = tmp_path / "no" / "out"
    words = {
        "folder": "Is a directory",
        "fifo": "not a regular file",
        "dangling-link": "a link to nothing",
        "missing-parent": "No such file",
    }[kind]
    with pytest.raises(OSError) as caught:
        check_writable(out)
    assert words in reason(caught.value)
    assert not (tmp_path / "nowhere").exists()  # nothing created through the link


def test_a_file_another_writer_creates_during_the_check_is_not_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check looked (no file), then opened with O_CREAT and removed what it opened
    as its own probe: a file another process created in between (the previous run's
    output landing, a colleague's) was deleted.  The other writer is played by a hook
    on the look; only a file the check itself created is removed."""
    out = tmp_path / "model.onnx"
    real_exists = os.path.exists

    def exists_then_written(path: object) -> bool:
        found = real_exists(path)  # type: ignore[arg-type]
        if Path(str(path)) == out and not found:
            out.write_bytes(b"theirs")  # just after the look, before the open
        return found

    monkeypatch.setattr(os.path, "exists", exists_then_written)
    check_writable(out)
    monkeypatch.undo()
    assert out.read_bytes() == b"theirs"
