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

"""The rootwrap filter file against the commands the driver builds.

Every command line privileged.py builds for the driver must be admitted
by ``etc/cinder/rootwrap.d/dmclone.filters`` (through oslo.rootwrap's own
matching), and nearby commands the driver never runs must be refused, so
that the filter admits exactly the driver's commands.
"""

import os
import shutil
import sys

import fixtures
from oslo_rootwrap import wrapper

from cinder.tests.unit import test

from cinder_dmclone import dmsetup
from cinder_dmclone import exception as dmc_exception
from cinder_dmclone import layout
from cinder_dmclone import privileged

FILTERS_DIR = os.path.join(os.path.dirname(__file__), '..', '..', 'etc',
                           'cinder', 'rootwrap.d')
NAME = 'dmclone-dmc--a-volume-1f2e3d4c-0000-4000-8000-000000000001'
UUID = 'DMCLONE-' + NAME
LV = '/dev/dmc-a/volume-1f2e3d4c-0000-4000-8000-000000000001'
META = LV + '-dmcmeta'
ENV = ['/usr/bin/env', 'LC_ALL=C']
THIN_LV = 'volume-1f2e3d4c-0000-4000-8000-000000000001'
SOURCE = ('/dev/disk/by-path/ip-10.0.0.1:3260-iscsi-iqn.2024-01.org.'
          'example.nodea:volume-1f2e3d4c-lun-0')


class RootwrapFilterTestCase(test.TestCase):

    def setUp(self):
        super().setUp()
        self.filters = wrapper.load_filters([os.path.abspath(FILTERS_DIR)])
        self.assertGreater(len(self.filters), 5)
        self.commands = []
        self.dm = privileged.DMSetup(execute=self._record)
        # rootwrap also wants the matched executable to exist in its
        # exec_dirs; stand-ins keep the test independent of this host.
        self.exec_dir = self.useFixture(fixtures.TempDir()).path
        for name in ('dmsetup', 'blockdev', 'modprobe', 'lvs', 'thin_dump',
                     'blkdiscard'):
            path = os.path.join(self.exec_dir, name)
            with open(path, 'w') as f:
                f.write('#!/bin/sh\nexit 0\n')
            os.chmod(path, 0o755)

    def _thin_map_commands(self):
        privileged.thin_device('cinder-volumes', 'volume-1',
                               execute=self._record)
        privileged.reserve_metadata_snap('cinder-volumes',
                                         'cinder-volumes-pool',
                                         execute=self._record)
        privileged.release_metadata_snap('cinder-volumes',
                                         'cinder-volumes-pool',
                                         execute=self._record)
        privileged.thin_dump('cinder-volumes', 'cinder-volumes-pool', 1,
                             execute=self._record)
        privileged.pool_zeroes('cinder-volumes', 'cinder-volumes-pool',
                               execute=self._record)
        privileged.thin_table('cinder-volumes', THIN_LV,
                              execute=self._record)
        privileged.thin_mapped_sectors('cinder-volumes', THIN_LV,
                                       execute=self._record)
        privileged.pool_block_sectors('cinder-volumes',
                                      'cinder-volumes-pool',
                                      execute=self._record)
        privileged.discard_regions('dmc-a', LV.rsplit('/', 1)[1],
                                   [(0, 128), (256, 128)],
                                   execute=self._record)
        privileged.discard_regions('dmc-a', LV.rsplit('/', 1)[1],
                                   [(0, 128)], zero=True,
                                   execute=self._record)
        privileged.pool_zeroing_recorded('cinder-volumes',
                                         'cinder-volumes-pool',
                                         execute=self._record)

    def _record(self, *cmd, **kwargs):
        self.commands.append(list(cmd))
        if cmd[2:3] == ('thin_dump',):
            return ('<superblock data_block_size="128"><device dev_id="1"/>'
                    '</superblock>', '')
        if cmd[2:3] == ('lvs',) and 'thin_id,pool_lv' in cmd:
            return '  1|cinder-volumes-pool\n', ''
        if cmd[2:3] == ('lvs',) and 'zero' in cmd:
            return '  1\n', ''
        if cmd[2:4] == ('dmsetup', 'table') and cmd[4].endswith('-tpool'):
            return '0 2097152 thin-pool 253:1 253:2 128 0 0\n', ''
        if cmd[2:4] == ('dmsetup', 'status') and 'volume--' in cmd[4]:
            return '0 2097152 thin 0 -\n', ''
        if cmd[2:4] == ('blockdev', '--getsz'):
            return '2097152\n', ''
        if cmd[2:4] == ('dmsetup', 'version'):
            return 'Library version: 1.02\nDriver version: 4.47.0\n', ''
        return '', ''

    def assertAdmitted(self, cmd):
        try:
            wrapper.match_filter(self.filters, list(cmd),
                                 exec_dirs=[self.exec_dir])
        except wrapper.NoFilterMatched:
            self.fail('rootwrap refuses a command the driver runs: %s'
                      % ' '.join(cmd))

    def assertRunsAsBuilt(self, filters, cmd):
        """Admitted, and run with the arguments (and LC_ALL=C) intact."""
        cmd = list(cmd)
        match = wrapper.match_filter(filters, list(cmd),
                                     exec_dirs=[self.exec_dir])
        self.assertEqual(cmd, match.get_command(list(cmd),
                                                exec_dirs=[self.exec_dir]))

    def assertRefused(self, cmd):
        self.assertRaises(wrapper.NoFilterMatched, wrapper.match_filter,
                          self.filters, list(cmd), exec_dirs=[self.exec_dir])

    def test_every_driver_command_is_admitted(self):
        linear = [dmsetup.linear_segment(0, 2097152, LV)]
        clone = [dmsetup.clone_segment(0, 2097152, META, LV, SOURCE, 128)]
        dm = self.dm
        dm.create(NAME, linear, UUID)
        dm.load(NAME, clone)
        dm.suspend(NAME)
        dm.suspend(NAME, flush=False)
        dm.resume(NAME)
        dm.reload(NAME, linear)
        dm.message(NAME, 'enable_hydration')
        dm.message(NAME, 'disable_hydration')
        dm.message(NAME, 'hydration_threshold', '64')
        dm.message(NAME, 'hydration_batch_size', '16')
        dm.exists(NAME)
        dm.status(NAME)
        dm.table(NAME)
        dm.clone_statuses()
        dm.targets()
        dm.version()
        dm.device_sectors(LV)
        dm.remove(NAME)
        dm.remove(NAME, retry=False)
        privileged.zero_metadata_head(META, execute=self._record)
        privileged.load_module('dm_clone', execute=self._record)
        privileged.thin_lvs('dmc-a', execute=self._record)
        self._thin_map_commands()
        self.assertGreater(len(self.commands), 24)
        for cmd in self.commands:
            self.assertAdmitted(cmd)

    def test_commands_run_under_lc_all_c(self):
        self.dm.remove(NAME)
        self.dm.device_sectors(LV)
        privileged.zero_metadata_head(META, execute=self._record)
        privileged.load_module('dm_clone', execute=self._record)
        self.assertEqual([['/usr/bin/env', 'LC_ALL=C', 'dmsetup', 'remove',
                           '--retry', NAME],
                          ['/usr/bin/env', 'LC_ALL=C', 'blockdev', '--getsz',
                           LV],
                          ['/usr/bin/env', 'LC_ALL=C', 'dd', 'if=/dev/zero',
                           'of=' + META, 'bs=1M', 'count=1', 'oflag=direct',
                           'conv=nocreat'],
                          ['/usr/bin/env', 'LC_ALL=C', 'modprobe',
                           'dm_clone']], self.commands)
        for cmd in self.commands:
            self.assertRunsAsBuilt(self.filters, cmd)

    def test_admitted_next_to_cinders_volume_filters(self):
        # rootwrap reads the files of a directory in no fixed order, and
        # Cinder's EnvFilters strip a bare leading "env" while matching:
        # the driver's commands must pass (with LC_ALL=C kept) whichever
        # file comes first.
        volume_filters = os.path.join(sys.prefix, 'etc', 'cinder',
                                      'rootwrap.d', 'volume.filters')
        if not os.path.exists(volume_filters):
            self.skipTest('Cinder\'s volume.filters is not installed')
        cinder_dir = self.useFixture(fixtures.TempDir()).path
        shutil.copy(volume_filters, cinder_dir)
        ours = os.path.abspath(FILTERS_DIR)
        self.dm.remove(NAME)
        self.dm.message(NAME, 'hydration_batch_size', '16')
        self.dm.device_sectors(LV)
        privileged.zero_metadata_head(META, execute=self._record)
        privileged.load_module('dm_clone', execute=self._record)
        privileged.thin_lvs('cinder-volumes', execute=self._record)
        self._thin_map_commands()
        for dirs in ([cinder_dir, ours], [ours, cinder_dir]):
            filters = wrapper.load_filters(dirs)
            for cmd in self.commands:
                self.assertRunsAsBuilt(filters, cmd)

    def test_every_handle_name_is_admitted(self):
        for vg in ('cinder-volumes', 'a', 'x.y+z_', 'a-b-c', 'vg--x'):
            for lv in ('volume-1f2e3d4c-0000-4000-8000-000000000001', 'lv',
                       'a-b', '_x', 'x--y'):
                name = layout.handle_name(vg, lv)
                self.assertAdmitted(ENV + ['dmsetup', 'create', name,
                                           '--uuid',
                                           layout.handle_uuid(vg, lv)])
                for op in ('load', 'resume', 'clear', 'info', 'status',
                           'table', 'suspend', 'remove'):
                    self.assertAdmitted(ENV + ['dmsetup', op, name])
                self.assertAdmitted(ENV + ['dmsetup', 'remove', '--retry',
                                           name])
                self.assertAdmitted(ENV + ['dmsetup', 'message', name, '0',
                                           'enable_hydration'])

    def test_foreign_device_names_are_refused(self):
        for name in (
                'cinder--volumes-volume--x',     # an LVM LV's own device
                'othervg-volume-1',              # another VG's LV
                'dmclone-vg-a/../x',             # a path
                '/dev/mapper/' + NAME,
                'dmclone-onlyonepart',           # no VG part
                'dmclone--vg-lv',                # VG part starts with '-'
                'dmclone-vg-',                   # no LV
                'dmclone-vg--lv',                # doubled dash: still VG
                'DMCLONE-' + NAME,               # a UUID, not a name
                'crypt-' + NAME,
                NAME + ' x'):
            for op in ('load', 'resume', 'clear', 'info', 'status', 'table',
                       'suspend', 'remove'):
                self.assertRefused(ENV + ['dmsetup', op, name])
            self.assertRefused(ENV + ['dmsetup', 'remove', '--retry', name])
            self.assertRefused(ENV + ['dmsetup', 'suspend', name,
                                      '--noflush'])
            self.assertRefused(ENV + ['dmsetup', 'message', name, '0',
                                      'enable_hydration'])
            self.assertRefused(ENV + ['dmsetup', 'message', name, '0',
                                      'hydration_batch_size', '16'])
            self.assertRefused(ENV + ['dmsetup', 'create', name, '--uuid',
                                      'DMCLONE-' + name])
        # a handle's name with another subsystem's UUID
        self.assertRefused(ENV + ['dmsetup', 'create', NAME, '--uuid',
                                  'LVM-abcdef'])
        self.assertRefused(ENV + ['dmsetup', 'create', NAME, '--uuid', NAME])

    def test_rename_is_refused(self):
        # The driver renames nothing; a rename between handle names could
        # swap two volumes under their users.
        self.assertRefused(ENV + ['dmsetup', 'rename', NAME,
                                  'dmclone-dmc--a-volume-other'])
        self.assertRefused(ENV + ['dmsetup', 'rename', NAME, NAME + '.old'])

    def test_modprobe_of_the_driver(self):
        self.assertAdmitted(ENV + ['modprobe', 'dm_clone'])
        # the shape of earlier releases, without LC_ALL=C
        self.assertRefused(['modprobe', 'dm_clone'])

    def test_dd_of_every_metadata_lv_is_admitted(self):
        for vg in ('cinder-volumes', 'a', 'x.y+z_', '.vg', 'vg..x'):
            for lv in ('volume-1f2e3d4c-0000-4000-8000-000000000001', 'lv',
                       'a-b', '_x', 'x--y', '..'):
                path = layout.lv_device(vg, lv + layout.METADATA_SUFFIX)
                self.commands = []
                privileged.zero_metadata_head(path, execute=self._record)
                self.assertAdmitted(self.commands[0])

    def test_dd_of_anything_else_is_refused(self):
        def dd(path, *args):
            return ENV + ['dd', 'if=/dev/zero', 'of=' + path] + list(
                args or ('bs=1M', 'count=1', 'oflag=direct', 'conv=nocreat'))
        self.assertAdmitted(dd(META))
        for path in (
                LV,                                   # a volume's data
                '/dev/sda', '/dev/mapper/' + NAME,
                '/dev/mapper/dmc--a-volume--1--dmcmeta',
                '/dev/mapper/x-dmcmeta',              # LVM's dm name
                '/dev/../x-dmcmeta', '/dev/./x-dmcmeta',
                '/dev/dmc-a/../x-dmcmeta', '/dev/dmc-a/sub/x-dmcmeta',
                '/dev/x-dmcmeta', '/etc/dmc-a/x-dmcmeta',
                '/dev/-vg/x-dmcmeta', '/dev/dmc-a/-x-dmcmeta',
                '/dev/dmc-a/x-dmcmeta.old', '/dev/dmc-a/x dmcmeta',
                META + '-dmcwipe-00000000'):
            self.assertRefused(dd(path))
        for args in (
                ('bs=1M', 'count=1', 'oflag=direct'),  # creates files
                ('bs=1M', 'count=1', 'conv=nocreat'),
                ('bs=1G', 'count=1', 'oflag=direct', 'conv=nocreat'),
                ('bs=1M', 'count=100', 'oflag=direct', 'conv=nocreat'),
                ('bs=1M', 'count=1', 'oflag=direct', 'conv=nocreat',
                 'seek=8'),
                ('bs=1M', 'count=1', 'oflag=direct', 'conv=notrunc'),
                ('bs=1M', 'count=1', 'conv=nocreat', 'oflag=direct')):
            self.assertRefused(dd(META, *args))
        self.assertRefused(ENV + ['dd', 'if=/dev/urandom', 'of=' + META,
                                  'bs=1M', 'count=1', 'oflag=direct',
                                  'conv=nocreat'])
        self.assertRefused(ENV + ['dd', 'if=' + META, 'of=/dev/zero',
                                  'bs=1M', 'count=1', 'oflag=direct',
                                  'conv=nocreat'])
        # without the prefix: Cinder's volume.filters, not this file
        self.assertRefused(dd(META)[2:])

    def test_nearby_commands_are_refused(self):
        env = ENV
        for cmd in (
                env + ['dmsetup', 'remove_all'],
                env + ['dmsetup', 'remove', '--force', NAME],
                env + ['dmsetup', 'status'],
                env + ['blockdev', '--setrw', LV],
                env + ['sh', '-c', 'true'],
                ['/usr/bin/env', 'LC_ALL=C', 'LD_PRELOAD=/tmp/x.so',
                 'dmsetup', 'version'],
                ['/usr/bin/env', 'LD_PRELOAD=/tmp/x.so', 'dmsetup',
                 'version'],
                ['/usr/bin/env', 'LC_ALL=C.UTF-8', 'dmsetup', 'version'],
                ['/tmp/env', 'LC_ALL=C', 'dmsetup', 'version'],
                ['env', 'LC_ALL=C', 'dmsetup', 'version'],
                ['dmsetup', 'version'],
                ['dmsetup', 'remove_all'],
                ['dmsetup', 'remove', '--force', NAME],
                ['dmsetup', 'create', NAME],                  # no uuid
                ['dmsetup', 'create', '../evil', '--uuid', UUID],
                ['dmsetup', 'create', NAME, '--uuid', 'a b'],
                ['dmsetup', 'message', NAME, '0', 'set_something', '1'],
                ['dmsetup', 'message', NAME, '0', 'hydration_threshold',
                 '1;rm'],
                ['dmsetup', 'status'],
                ['dmsetup', 'wipe_table', NAME],
                ['dmsetup', 'mknodes'],
                ['blockdev', '--setrw', LV],
                ['blockdev', '--getsz', '/etc/shadow; true'],
                ['modprobe', '-r', 'dm_clone'],
                ['modprobe', 'evil_module'],
                env + ['modprobe', '-r', 'dm_clone'],
                env + ['modprobe', 'evil_module'],
                env + ['modprobe', 'dm_clone', 'evil=1'],
                env + ['modprobe', '-a', 'dm_clone', 'evil_module'],
                env + ['dd', 'if=/dev/zero', 'of=' + LV, 'bs=1M',
                       'count=1', 'oflag=direct', 'conv=nocreat']):
            self.assertRefused(cmd)

    def test_lvs_of_thin_pools_exactly(self):
        privileged.thin_lvs('cinder-volumes', execute=self._record)
        (cmd,) = self.commands
        self.assertRunsAsBuilt(self.filters, cmd)
        for vg in ('a', 'x.y+z_', 'a-b-c', 'vg--x'):
            self.assertAdmitted(cmd[:-1] + [vg])
        columns = cmd.index('-o') + 1
        for bad in (
                cmd[:-1] + ['vg/lv'],                     # one LV
                cmd[:-1] + ['-a'],
                cmd[:-1] + ['../x'],
                cmd[:-1],                                 # every VG
                cmd + ['other'],
                cmd[:columns] + ['lv_name,lv_tags'] + cmd[columns + 1:],
                cmd[:columns] + [cmd[columns] + ',lv_tags']
                + cmd[columns + 1:],
                [c if c != '|' else ':' for c in cmd],
                ENV + ['lvs'],
                ENV + ['lvremove', '-f', 'cinder-volumes'],
                cmd[2:]):                                 # no LC_ALL=C
            self.assertRefused(bad)

    def test_thin_map_commands_exactly(self):
        self._thin_map_commands()
        for cmd in self.commands:
            self.assertRunsAsBuilt(self.filters, cmd)
        lvs, reserve, release, dump, table, lv_table, lv_status, \
            pool_table, discard, _second, zero, recorded = self.commands
        self.assertEqual(ENV + ['lvs', '--noheadings', '--binary', '-o',
                                'zero', 'cinder-volumes/cinder-volumes-pool'],
                         recorded)
        for bad in (recorded[:-1] + ['vg'],
                    recorded[:-1] + ['vg/lv/x'],
                    [c if c != 'zero' else 'lv_tags' for c in recorded]):
            self.assertRefused(bad)
        self.assertEqual(ENV + ['dmsetup', 'table',
                                'cinder--volumes-' + THIN_LV.replace(
                                    '-', '--')], lv_table)
        self.assertEqual(ENV + ['dmsetup', 'status',
                                'cinder--volumes-' + THIN_LV.replace(
                                    '-', '--')], lv_status)
        self.assertEqual(table, pool_table)
        for bad in (lv_status + ['--noflush'],
                    ENV + ['dmsetup', 'status', 'vg-other'],
                    ENV + ['dmsetup', 'remove', lv_status[-1]]):
            self.assertRefused(bad)
        pool = 'cinder--volumes-cinder--volumes--pool-tpool'
        tmeta = '/dev/mapper/cinder--volumes-cinder--volumes--pool_tmeta'
        self.assertEqual(ENV + ['dmsetup', 'message', pool, '0',
                                'reserve_metadata_snap'], reserve)
        self.assertEqual(ENV + ['thin_dump', '--format', 'xml',
                                '--metadata-snap', '--dev-id', '1', tmeta],
                         dump)
        for bad in (
                lvs[:-1] + ['vg'],                        # every LV of vg
                lvs[:-1] + ['vg/lv/x'],
                lvs[:-1] + ['../x/lv'],
                lvs + ['vg/other'],
                [c if c != 'thin_id,pool_lv' else 'thin_id,lv_tags'
                 for c in lvs],
                ENV + ['dmsetup', 'message', pool, '0', 'delete', '1'],
                ENV + ['dmsetup', 'message', pool, '0', 'create_thin', '9'],
                ENV + ['dmsetup', 'message', pool, '0',
                       'set_transaction_id', '1', '2'],
                ENV + ['dmsetup', 'message', 'vg-pool', '0',
                       'reserve_metadata_snap'],              # not -tpool
                ENV + ['dmsetup', 'message', NAME, '0',
                       'reserve_metadata_snap'],
                ENV + ['dmsetup', 'message', 'a/../b-c-tpool', '0',
                       'release_metadata_snap'],
                reserve[2:],                              # no LC_ALL=C
                dump[:-1] + ['/dev/mapper/vg-pool_tdata'],
                dump[:-1] + ['/dev/sda'],
                dump[:-1] + ['/dev/mapper/../sda_tmeta'],
                [c for c in dump if c != '--metadata-snap'],  # live: no
                dump[:4] + ['--metadata-snap=5'] + dump[5:],
                dump[:4] + ['--repair'] + dump[4:],
                dump + ['-o', '/etc/shadow'],
                table[:-1] + ['vg-pool'],                 # not -tpool
                table[:-1] + ['vg-pool-tdata'],
                table[:-1] + ['a/../b-c-tpool'],
                table[:-1] + ['--showkeys', table[-1]],
                table + ['other'],
                table[:-1],                               # every device
                lv_table + ['--showkeys'],
                lv_table[:-1] + ['--showkeys', lv_table[-1]],
                lv_table[:-1] + ['vg-lv/../x'],
                lv_table[:-1] + ['vg-lv x'],
                lv_table[:-1] + ['onlyonepart'],
                lv_table[:-1] + ['vg-volume--1'],         # not a volume's
                lv_table[:-1] + ['vg-other--' + lv_table[-1].split(
                    '-volume--')[1]],
                ENV + ['thin_restore', '-i', '/tmp/x', '-o', tmeta],
                discard[:-1] + [LV],                      # the LV itself
                discard[:-1] + ['/dev/mapper/dmc--a-volume--1'],
                discard[:-1] + ['/dev/sda'],
                discard[:-1] + ['/dev/mapper/' + layout.lost_source_name(
                    'dmc-a', 'volume-1')],
                [c for c in discard if c != '--force'],
                discard[:3] + ['--secure'] + discard[3:],
                [c if c != '--offset' else '-o' for c in discard],
                [c if c != '0' else '1G' for c in discard],
                [c if c != '65536' else '-1' for c in discard],
                discard[:-1],                             # whole device
                zero[:3] + zero[4:5] + zero[3:4] + zero[5:]):  # reordered
            self.assertRefused(bad)

    def test_names_are_validated_before_any_command(self):
        for bad in ('../x', 'a b', '', 'x;rm -rf /', '-rf'):
            self.assertRaises(dmc_exception.InvalidDMName, self.dm.status,
                              bad)
        for bad in (LV, '/dev/../x-dmcmeta', '/dev/mapper/x-dmcmeta'):
            self.assertRaises(dmc_exception.InvalidDMName,
                              privileged.zero_metadata_head, bad,
                              execute=self._record)
        self.assertRaises(dmc_exception.InvalidDMName,
                          privileged.load_module, 'evil_module',
                          execute=self._record)
        self.assertEqual([], self.commands)

    def test_filter_file_parses(self):
        names = {f.name for f in wrapper.load_filters(
            [os.path.abspath(FILTERS_DIR)])}
        self.assertIn('dmsetup_create', names)
        self.assertIn('blockdev_getsz', names)
        self.assertIn('dd_metadata_head', names)
        self.assertIn('modprobe_dm_clone', names)
        self.assertIn('lvs_thin', names)
        self.assertIn('thin_dump_snap', names)
        self.assertIn('dmsetup_pool_table', names)
        self.assertIn('dmsetup_lv_table', names)
        self.assertIn('blkdiscard_handle', names)
