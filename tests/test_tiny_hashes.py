"""dev.tiny_hashes hashes a parquet file by its content: the same table written another way (another
compression here; another pyarrow in practice, whose version is in the footer) keeps its hash, and
one changed value changes it."""
import hashlib

import pandas as pd

from dev.tiny_hashes import parquet_content


def test_parquet_content_ignores_how_the_file_was_written_not_its_values(tmp_path):
    frame = pd.DataFrame({"step": [0, 1, 2], "logprob": [-0.1, -2.5e-7, -13.0], "tokens": [[1, 2], [3], []]})
    frame.to_parquet(tmp_path / "a.parquet", compression="snappy")
    frame.to_parquet(tmp_path / "b.parquet", compression=None)
    assert (tmp_path / "a.parquet").read_bytes() != (tmp_path / "b.parquet").read_bytes()
    digest = lambda name: hashlib.sha256(parquet_content(tmp_path / name)).hexdigest()  # noqa: E731
    assert digest("a.parquet") == digest("b.parquet")
    frame.loc[1, "logprob"] = -2.5000000000000004e-7  # one ulp away
    frame.to_parquet(tmp_path / "c.parquet", compression="snappy")
    assert digest("c.parquet") != digest("a.parquet")
    frame.loc[1, "logprob"] = -2.5e-7
    frame.astype({"step": "int32"}).to_parquet(tmp_path / "d.parquet")  # the same rows as CSV, another schema
    assert digest("d.parquet") != digest("a.parquet")
