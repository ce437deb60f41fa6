"""Report helpers: progress lines with an estimate of the time left."""

import time

from spec_decode import report


def test_progress_line_counts_and_estimates_the_time_left():
  line = report.progress_line('teacher outputs', 25, 100, time.time() - 30)
  assert line.startswith('teacher outputs: 25/100 (25%), 30 s so far')
  assert 'about 1.5 min left' in line  # 30 s per quarter: 90 s to go.
  done = report.progress_line('teacher outputs', 100, 100, time.time() - 5)
  assert 'left' not in done
