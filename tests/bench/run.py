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

"""``tox -e bench``: run the benchmarks in the testbed, then the report.

    python tests/bench/run.py [--scale full|quick] [--timeout S]
                              [--layout one-kernel|separate]
                              [--out DIR] [--merge-into RESULTS.json]
                              [-- PYTEST_ARGS...]

Boots the testbed guest (tools/testbed/run) on tests/bench, finds the
run directory the runner prints, and renders
``<run>/artifacts/bench/results.json`` with tests/bench/report.py into
``--out`` (default: doc/source/benchmarks for a full run, the run's
artifacts directory for a quick one).  ``--layout`` is the testbed's
(default: its own, one kernel): each benchmark is marked with the
layouts it is written for and the others are deselected, so ``--layout
separate`` runs test_move.py and test_thin_move.py.  A partial results
file (a benchmark failed) is still rendered.  Exit status: the guest's.
"""

import argparse
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import report  # noqa: E402


def main(argv):
    if '--' in argv:
        i = argv.index('--')
        argv, extra = argv[:i], argv[i + 1:]
    else:
        extra = []
    p = argparse.ArgumentParser(prog='tests/bench/run.py')
    p.add_argument('--scale', choices=('full', 'quick'), default='full')
    p.add_argument('--timeout', type=int, default=5400)
    p.add_argument('--layout', choices=('one-kernel', 'separate'),
                   help='the testbed layout (default: the testbed\'s)')
    p.add_argument('--out')
    p.add_argument('--merge-into', metavar='RESULTS.json',
                   help='an earlier results file this run completes: its '
                        'sections are kept unless this run measured them')
    args = p.parse_args(argv)
    layout = ['--layout', args.layout] if args.layout else []
    cmd = ([os.path.join(TREE, 'tools', 'testbed', 'run'),
            '--timeout', str(args.timeout)] + layout
           + ['--', 'tests/bench', '--bench-scale=%s' % args.scale] + extra)
    print('bench: %s' % ' '.join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True,
                            errors='replace')
    run_dir = None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        m = re.search(r'testbed: run directory: (\S+)', line)
        if m:
            run_dir = m.group(1)
    rc = proc.wait()
    if run_dir is None:
        print('bench: the testbed printed no run directory')
        return rc or 1
    results = os.path.join(run_dir, 'artifacts', 'bench', 'results.json')
    if not os.path.exists(results):
        print('bench: no results file (%s)' % results)
        return rc or 1
    out = args.out or (os.path.join(TREE, 'doc', 'source', 'benchmarks')
                       if args.scale == 'full'
                       else os.path.dirname(results))
    inputs = ([args.merge_into] if args.merge_into else []) + [results]
    report.main(['report'] + inputs + [out])
    print('bench: guest rc=%d, results %s' % (rc, results))
    return rc


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
