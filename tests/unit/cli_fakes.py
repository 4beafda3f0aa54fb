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

"""A node in canned dmsetup and lvs output, for cinder-dmclone's tests.

Node content (volume group ``cinder-volumes``, metadata VG ``meta``):
``H1`` a linear handle with its LV, ``H2`` a clone hydrating from an
iSCSI disk (``LINKS``), ``H3`` a linear handle whose LV is gone, ``OTHER``
a clone of another volume group, and a metadata LV of ``U4`` in ``meta``.
"""

import io
import json
import logging

from cinder.tests.unit import test

from cinder_dmclone.cmd import cli
from cinder_dmclone import privileged

U1 = '11111111-1111-1111-1111-111111111111'
U2 = '22222222-2222-2222-2222-222222222222'
U3 = '33333333-3333-3333-3333-333333333333'
U4 = '44444444-4444-4444-4444-444444444444'
H1 = 'dmclone-cinder--volumes-volume-' + U1      # linear, LV present
H2 = 'dmclone-cinder--volumes-volume-' + U2      # clone, hydrating
H3 = 'dmclone-cinder--volumes-volume-' + U3      # linear, LV gone
OTHER = 'dmclone-other-volume-' + U4             # another backend's


def clone_status(hydrated, total=1024, features='0'):
    return ('8 40/4096 128 %d/%d 16 %s 4 hydration_threshold 64 '
            'hydration_batch_size 16 rw' % (hydrated, total, features))


def status_text(hydrated):
    return '\n'.join([
        '%s: 0 2097152 linear ' % H1,
        '%s: 0 131072 clone %s' % (H2, clone_status(hydrated)),
        '%s: 0 2097152 linear ' % H3,
        '%s: 0 131072 clone %s' % (OTHER, clone_status(1024)),
        'cinder--volumes-volume--%s: 0 2097152 linear ' % U1,
    ]) + '\n'


TABLES = ('%s: 0 131072 clone 253:9 253:8 8:16 128 0 4 '
          'hydration_threshold 64 hydration_batch_size 16\n'
          '%s: 0 131072 clone 253:11 253:10 8:32 128\n' % (H2, OTHER))
UUIDS = ''.join('%s|DMCLONE-%s\n' % (n, n) for n in (H1, H2, H3, OTHER))
LVS = ('  cinder-volumes|volume-%s\n  cinder-volumes|volume-%s\n'
       '  meta|volume-%s-dmcmeta\n  meta|volume-%s-dmcmeta\n'
       % (U1, U2, U2, U4))


class FakeNode(object):
    """Answers the commands the tool runs, and records them."""

    def __init__(self, statuses=None, tables=TABLES, uuids=UUIDS, lvs=LVS):
        self.statuses = list(statuses or [status_text(256)])
        self.tables = tables
        self.uuids = uuids
        self.lvs = lvs
        self.calls = []

    def __call__(self, *cmd, **kwargs):
        # Every command runs under LC_ALL=C; record it without the prefix.
        if cmd[:2] != privileged.ENV_PREFIX:
            raise AssertionError('not run under LC_ALL=C: %r' % (cmd,))
        cmd = cmd[2:]
        self.calls.append(cmd)
        if cmd[:2] == ('dmsetup', 'status'):
            # the last sample again when the test gave no more
            if len(self.statuses) > 1:
                return self.statuses.pop(0), ''
            return self.statuses[0], ''
        if cmd[:2] == ('dmsetup', 'table'):
            return self.tables, ''
        if cmd[:2] == ('dmsetup', 'info'):
            return self.uuids, ''
        if cmd[0] == 'lvs':
            if isinstance(self.lvs, Exception):
                raise self.lvs
            return self.lvs, ''
        raise AssertionError('unexpected command %r' % (cmd,))


class FakeClock(object):
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


LINKS = {'8:16': ('10.0.0.1:3260', 'iqn.2010-10.org.openstack:volume-' + U2,
                  0)}


class CLITestCase(test.TestCase):
    """Runs cinder-dmclone on a FakeNode, a FakeClock and LINKS."""

    def setUp(self):
        super().setUp()
        self.clock = FakeClock()
        # cliff sets up logging on the root logger at each run: undo it.
        root = logging.getLogger()
        handlers, level = list(root.handlers), root.level

        def restore():
            root.handlers[:] = handlers
            root.setLevel(level)
        self.addCleanup(restore)

    def run_cli(self, argv, node=None, links=LINKS, **hooks):
        """(exit status, stdout, stderr) of ``cinder-dmclone ARGV``.

        ``hooks`` add to or replace the node's (``execute=None``: the
        real commands, and the root check).
        """
        out, err = io.StringIO(), io.StringIO()
        hooks = dict({'execute': node or FakeNode(),
                      'sleep': self.clock.sleep, 'clock': self.clock,
                      'links': links}, **hooks)
        app = cli.DMCloneApp(stdout=out, stderr=err, **hooks)
        code = app.run(list(argv))
        return code, out.getvalue(), err.getvalue()

    def run_json(self, argv, node=None, command='status', **hooks):
        """(exit status, parsed output) of ``COMMAND ARGV -f json``."""
        code, out, err = self.run_cli(command.split() + list(argv) +
                                      ['-f', 'json'], node, **hooks)
        self.assertEqual('', err)
        return code, json.loads(out)

    def table_rows(self, out):
        """The rows of a cliff table (cells stripped), header first.

        The lines of a multi-line cell are joined with newlines.
        """
        rows = []
        for line in out.splitlines():
            if not line.startswith('|'):
                continue
            cells = [cell.strip() for cell in line.split('|')[1:-1]]
            if rows and not cells[0]:
                rows[-1] = [('%s\n%s' % (old, new)) if new else old
                            for old, new in zip(rows[-1], cells)]
            else:
                rows.append(cells)
        return rows

    def move_row(self, argv, node=None, **hooks):
        """The cells of U2's row in ``move list ARGV``."""
        code, out, err = self.run_cli(['move', 'list'] + list(argv), node,
                                      **hooks)
        self.assertEqual((0, ''), (code, err))
        return next(row for row in self.table_rows(out) if row[0] == U2)
