"""The committed data files must match SHA256SUMS: reported numbers are only comparable on them."""
import shutil

import pytest

from specdec_jax.data import checksums

EXPECTED_FILES = {f"{task}/{split}.jsonl.xz"
                  for task in ("translate_en_de", "summarize", "code_complete")
                  for split in ("train", "valid")}


def test_shipped_data_matches_sums():
  verified = checksums.verify()
  assert set(verified) == EXPECTED_FILES


def test_sums_file_is_sha256sum_format():
  sums = checksums.read_sums(checksums.ASSETS_DATA_DIR / checksums.SUMS_FILENAME)
  assert set(sums) == EXPECTED_FILES
  assert all(len(d) == 64 and int(d, 16) >= 0 for d in sums.values())


@pytest.fixture
def data_copy(tmp_path):
  src = checksums.ASSETS_DATA_DIR
  (tmp_path / "code_complete").mkdir()
  shutil.copy(src / "code_complete" / "valid.jsonl.xz", tmp_path / "code_complete")
  shutil.copy(src / "code_complete" / "train.jsonl.xz", tmp_path / "code_complete")
  checksums.write_sums(tmp_path)
  return tmp_path


def test_write_then_verify(data_copy):
  assert set(checksums.verify(data_copy)) == {"code_complete/valid.jsonl.xz",
                                              "code_complete/train.jsonl.xz"}
  shipped = checksums.read_sums(checksums.ASSETS_DATA_DIR / "SHA256SUMS")
  written = checksums.read_sums(data_copy / "SHA256SUMS")
  assert written["code_complete/valid.jsonl.xz"] == shipped["code_complete/valid.jsonl.xz"]


def test_modified_file_is_reported(data_copy):
  with open(data_copy / "code_complete" / "valid.jsonl.xz", "ab") as f:
    f.write(b"x")
  with pytest.raises(checksums.ChecksumError, match="code_complete/valid.jsonl.xz: sha256"):
    checksums.verify(data_copy)


def test_missing_file_is_reported(data_copy):
  (data_copy / "code_complete" / "train.jsonl.xz").unlink()
  with pytest.raises(checksums.ChecksumError, match="train.jsonl.xz: missing"):
    checksums.verify(data_copy)


def test_unlisted_file_and_missing_sums(data_copy, tmp_path_factory):
  with pytest.raises(checksums.ChecksumError, match="not listed"):
    checksums.verify(data_copy, files=["summarize/valid.jsonl.xz"])
  with pytest.raises(checksums.ChecksumError, match="no SHA256SUMS"):
    checksums.verify(tmp_path_factory.mktemp("empty"))
