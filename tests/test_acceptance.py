"""The pair's kept acceptance and output length (`spec_decode.acceptance`).

How gamma='auto' calls keep their figures is tested with the rule, in
test_adaptive.py; here, what the kept figures survive.
"""

import pytest

from spec_decode import acceptance
from spec_decode import cost_cache
from spec_decode.sampling import SamplingConfig

from conftest import perturbed
from conftest import random_model


def test_a_corrupt_acceptance_entry_is_ignored(tmp_path, monkeypatch):
  monkeypatch.setenv(cost_cache.CACHE_DIR_ENV, str(tmp_path))
  cost_cache.forget_acceptance()
  target = random_model(0)
  draft = perturbed(target, 0.3, seed=1)
  sampling = SamplingConfig(0.0)
  acceptance.record_acceptance(target, draft, sampling, 6.0, 10)
  path = cost_cache.cache_path()
  text = open(path).read().replace('6.0', '60.0')  # sum > count: corrupt
  with open(path, 'w') as f:
    f.write(text)
  cost_cache.forget_acceptance()
  assert acceptance.acceptance_prior(target, draft, sampling) is None
  # Lengths that cannot be (fewer tokens than rows) are dropped, the
  # acceptance beside them kept.
  acceptance.record_acceptance(target, draft, sampling, 6.0, 10, 30.0, 3)
  text = open(path).read().replace('30.0', '2.0')
  with open(path, 'w') as f:
    f.write(text)
  cost_cache.forget_acceptance()
  assert acceptance.acceptance_prior(target, draft, sampling) == pytest.approx(
      0.6)
  assert acceptance.output_length(target, draft, sampling) is None
  with open(path, 'w') as f:
    f.write('{not json')
  cost_cache.forget_acceptance()
  assert acceptance.acceptance_prior(target, draft, sampling) is None
  cost_cache.forget_acceptance()
