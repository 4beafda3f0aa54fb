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

"""Fixtures of the fault suite (``tox -e faults``); testbed guest only.

The suite runs on the harness's driver cluster
(``tests.harness.driver_cluster``: both nodes' volume services running
the real driver on the real kernel) with two differences:

* every root command of the services goes through ``sudo cinder-rootwrap``
  with Cinder's volume.filters and this project's dmclone.filters
  (:func:`tests.harness.volume_node.use_rootwrap`); a command the
  filters refuse fails the test that ran it;
* every test adds a row to the fault matrix (scenario, result, time to
  recover), printed at the end of the run and written to
  ``artifacts/faults/matrix.{json,md}``, whose first line names the
  testbed layout, the run and its date (:func:`run_label`).

``@pytest.mark.layouts('one-kernel', 'separate')``: the testbed layouts a
test is written for (unmarked: one-kernel); the others deselect it.
Outside the guest every test here is SKIPPED, never reported as passed.
"""

import json
import os
import time

import pytest

# The harness's fixtures: the leak check after every test (which boots a
# node a failed test left down first), the topology, undo callables.
from tests.harness import pytest_fixtures
from tests.harness.pytest_fixtures import _testbed_logging  # noqa: F401
from tests.harness.pytest_fixtures import cleanup  # noqa: F401
from tests.harness.pytest_fixtures import cluster_running  # noqa: F401
from tests.harness.pytest_fixtures import control_plane  # noqa: F401
from tests.harness.pytest_fixtures import no_leaks  # noqa: F401
from tests.harness.pytest_fixtures import nodes_answer  # noqa: F401
from tests.harness.pytest_fixtures import topo  # noqa: F401
from tests.harness import selection
from tests.harness import testbed
from tests.harness import volume_node

NOT_IN_TESTBED = (
    'NOT RUN: the fault suite needs the cinder-dmclone testbed guest (%s '
    'is missing, so this is not it); run it with tox -e faults'
    % testbed.TOPOLOGY_PATH)

ROOTWRAP_DIR = volume_node.RUN_DIR + '/rootwrap'

_MATRIX = []


def pytest_configure(config):
    config.addinivalue_line('markers', selection.LAYOUT_MARKER)


def pytest_collection_modifyitems(config, items):
    selection.select_layout(config, items)
    selection.skip_outside_testbed(items, 'tests/faults/', NOT_IN_TESTBED)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, 'report_' + report.when, report)


@pytest.fixture(scope='session')
def rootwrap():
    """Root commands of the workers go through cinder-rootwrap.

    (Node B's configuration is installed here; a worker on another
    kernel installs its node's, volume_node.use_rootwrap.)
    """
    os.makedirs(volume_node.RUN_DIR, exist_ok=True)
    path = volume_node.install_rootwrap(ROOTWRAP_DIR)
    volume_node.clear_root_commands()
    os.environ[volume_node.ROOTWRAP_ENV] = path
    yield path
    os.environ.pop(volume_node.ROOTWRAP_ENV, None)


@pytest.fixture(scope='session')
def cluster(rootwrap, control_plane):  # noqa: F811 (the fixture above)
    """Both nodes' volume services (through rootwrap) for the session."""
    yield from pytest_fixtures.running_cluster(control_plane)


class Row(object):
    """One line of the fault matrix, filled in by the test."""

    def __init__(self, name):
        self.name = name
        self.scenario = name
        self.detail = ''
        self.recover_s = None
        self.started = time.monotonic()

    def recovered(self, t0):
        self.recover_s = round(time.monotonic() - t0, 1)


@pytest.fixture(autouse=True)
def fault(request):
    """The test's row in the matrix; refused root commands fail it."""
    if not testbed.in_testbed():
        yield None
        return
    before = volume_node.root_command_marks()
    row = Row(request.node.name)
    yield row
    lines = volume_node.root_commands(before)
    refused = [line for line in lines if line.startswith('REFUSED')]
    call = getattr(request.node, 'report_call', None)
    if call is not None and call.skipped:
        result = 'NOT RUN'
    else:
        result = 'passed' if call is not None and call.passed else 'FAILED'
    _MATRIX.append({'test': request.node.name, 'scenario': row.scenario,
                    'result': result, 'recover_s': row.recover_s,
                    'detail': row.detail,
                    'seconds': round(time.monotonic() - row.started, 1),
                    'root_commands': len(lines), 'refused': len(refused)})
    _write_matrix()
    if refused:
        pytest.fail('cinder-rootwrap refused:\n  ' + '\n  '.join(refused),
                    pytrace=False)


#: the testbed layouts (tools/testbed/run --layout), as the matrix says
LAYOUTS = {'one-kernel': 'one-kernel (every node a network namespace of '
                         'one guest kernel)',
           'separate': 'separate (every node its own guest kernel)'}


_LABEL = {}


def run_label():
    """{'layout', 'run', 'date'} of this run, for the matrix's header.

    The run is the runner's run directory (``testbed.run=`` on the
    guest kernel's command line), '?' when it cannot be told; the date
    the first row's.
    """
    if _LABEL:
        return dict(_LABEL)
    run = '?'
    try:
        with open('/proc/cmdline') as f:
            for arg in f.read().split():
                if arg.startswith('testbed.run='):
                    run = os.path.basename(arg.partition('=')[2].rstrip('/'))
    except OSError:
        pass
    _LABEL.update(layout=testbed.topology().layout, run=run,
                  date=time.strftime('%Y-%m-%d'))
    return dict(_LABEL)


def _markdown(rows, commands, refused, label):
    out = ['Layout: %s; run %s, %s.' % (
               LAYOUTS.get(label['layout'], label['layout']), label['run'],
               label['date']),
           '',
           '| scenario | result | time to recover, s | test time, s '
           '| root commands (refused) | what happened |',
           '|---|---|---|---|---|---|']
    for r in rows:
        out.append('| %s | %s | %s | %.0f | %d (%d) | %s |' % (
            r['scenario'], r['result'],
            '-' if r['recover_s'] is None else '%.1f' % r['recover_s'],
            r['seconds'], r['root_commands'], r['refused'],
            r['detail'].replace('|', '/')))
    out.append('')
    out.append('%d root commands ran through cinder-rootwrap, %d refused.'
               % (commands, refused))
    return '\n'.join(out)


def pytest_terminal_summary(terminalreporter):
    if not _MATRIX:
        return
    text = _write_matrix()
    terminalreporter.write_sep('=', 'fault matrix')
    terminalreporter.write_line(text)


def _write_matrix():
    """Write the matrix so far; return its Markdown.

    Called after every test, so a run cut short keeps what it measured.
    """
    lines = volume_node.root_commands()
    refused = len([x for x in lines if x.startswith('REFUSED')])
    label = run_label()
    text = _markdown(_MATRIX, len(lines), refused, label)
    out = os.path.join(testbed.topology().artifacts_dir, 'faults')
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, 'matrix.json'), 'w') as f:
        json.dump(dict(label, rows=_MATRIX, root_commands=len(lines),
                       refused=refused,
                       distinct_commands=sorted({' '.join(
                           x.split()[1:3]) for x in lines})), f, indent=1)
    with open(os.path.join(out, 'matrix.md'), 'w') as f:
        f.write(text + '\n')
    return text
