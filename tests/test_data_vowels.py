import numpy as np
import pytest

from fedhet.algorithms.f3 import vowels as dv
from fedhet.algorithms.datapath import DatasetNotFound

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


def test_parse_ts_small(tmp_path):
    ch = ":".join(["1,2,3"] * 12)
    p = tmp_path / "x.ts"
    p.write_text("#c\n@problemName X\n@data\n" + ch + ":4\n")
    s = dv.parse_ts(p)
    assert s.series.shape == (1, 12, 29) and s.lengths.tolist() == [3] and s.labels.tolist() == [3]
    assert s.mask[0, :3].all() and not s.mask[0, 3:].any() and s.series[0, 0, 3:].sum() == 0
    p.write_text("@data\n1,2:3\n")
    with pytest.raises(ValueError, match="line 2"):
        dv.parse_ts(p)


@pytest.mark.data
def test_real_vowels():
    try:
        tr, te = dv.load_vowels()
    except DatasetNotFound:
        pytest.skip("japanese_vowels data not present")
    assert tr.series.shape == (270, 12, 29) and te.series.shape[0] == 370
    assert tr.lengths.min() >= 7 and max(tr.lengths.max(), te.lengths.max()) <= 29
    assert set(np.unique(tr.labels)) == set(range(9))
    assert tr.owner(3).shape == (270, 29, 1)
