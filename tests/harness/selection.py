#    Licensed under the Apache License, Version 2.0 (the "License"); you may
#    not use this file except in compliance with the License. You may obtain
#    a copy of the License at
#
#         http://www.apache.org/licenses/LICENSE-2.0
#
#    Unless required by applicable law or agreed to in writing, software
#    distributed under the License is distributed on an "AS IS" BASIS, WITHOUT
#    WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the
#    License for the specific language governing permissions and limitations
#    under the License.

"""Which tests of a suite run, and how long each module took.

For the hooks of the suites' conftest.py: the ``--tier`` and layout
selection (deselected tests are reported as such), the skip of a
suite's tests outside the testbed guest, and the per-module timings of
the terminal summary.
"""

import pytest

from tests.harness import testbed


def select_tier(config, items):
    """Deselect the tests outside ``--tier`` (reported as deselected)."""
    tier = config.getoption('--tier')
    if tier == 'all':
        return
    keep, drop = [], []
    for item in items:
        extended = item.get_closest_marker('extended') is not None
        (keep if extended == (tier == 'extended') else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


LAYOUT_MARKER = ('layouts(*names): the testbed layouts a test is written '
                 'for (one-kernel, separate); unmarked: one-kernel only')


def select_layout(config, items):
    """Deselect the tests not written for the running testbed's layout.

    ``--layout separate`` gives every node its own kernel; a test that
    inspects node A's kernel state from node B's process is written for
    the one-kernel layout (the default when unmarked) and is reported as
    deselected there, never as passed.
    """
    if not testbed.in_testbed():
        return
    layout = testbed.topology().layout
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker('layouts')
        layouts = marker.args if marker else ('one-kernel',)
        (keep if layout in layouts else drop).append(item)
    if drop:
        testbed.LOG.info('%d tests deselected: not written for the %s '
                         'layout', len(drop), layout)
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def skip_outside_testbed(items, folder, reason):
    """Mark the tests under ``folder`` SKIPPED when not in the guest.

    For the conftest of each suite that needs the testbed: outside it,
    its tests are reported as skipped with ``reason``, never as passed.
    """
    if testbed.in_testbed():
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if folder in str(item.fspath):
            item.add_marker(skip)


def module_timings(stats):
    """[(module, (seconds, tests run))], slowest first, from pytest's stats.

    ``stats``: the terminal reporter's reports by outcome; every phase's
    duration (setup, call, teardown) counts for its test's module.
    """
    seconds, tests = {}, {}
    for reports in stats.values():
        for report in reports:
            nodeid = getattr(report, 'nodeid', '')
            duration = getattr(report, 'duration', None)
            if not nodeid or duration is None:
                continue
            module = nodeid.split('::', 1)[0]
            seconds[module] = seconds.get(module, 0.0) + duration
            if getattr(report, 'when', None) == 'call':
                tests[module] = tests.get(module, 0) + 1
    return sorted(((m, (seconds[m], tests.get(m, 0))) for m in seconds),
                  key=lambda item: -item[1][0])
