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

"""The source's thin map: snapshot, dump, release, and their records."""

import os
import sys
import threading
import time
import types

import fixtures
from oslo_concurrency import processutils
import tenacity
import testtools

from cinder import coordination
from cinder.tests.unit import test

from cinder_dmclone import exception
from cinder_dmclone import privileged
from cinder_dmclone import region_map
from cinder_dmclone import thin
from tests.unit import fakes

VG = 'cinder-volumes'
LV = 'volume-1'
SECTORS = 2048          # 16 regions of 128 sectors
REGION = 128


def state_and_pool(case):
    """(the service's state directory, its pool mapping LV) for ``case``."""
    state = os.path.join(case.useFixture(fixtures.TempDir()).path,
                         'dmclone')
    pool = fakes.FakeThinPool(VG)
    pool.add(LV, [(0, 2), (9, 10)])
    return state, pool


class PoolLock(object):
    """A pool's lock: the test knows while it is held."""

    def __init__(self, test):
        self.test = test

    def acquire(self, blocking=True):
        # (The pool's snapshot is only ever touched under its lock.)
        self.test.holding = True
        return True

    def release(self):
        self.test.holding = False


class ThinMapsTestCase(test.TestCase):

    def setUp(self):
        super().setUp()
        self.dir, self.pool = state_and_pool(self)
        self.commands = []
        self.locks = []
        self.maps = self.new_maps()

    def new_maps(self, **kwargs):
        return region_map.ThinMaps('node-a', VG, self.dir,
                                   execute=self.execute, root_helper='rw',
                                   lock=self.lock, **kwargs)

    def lock(self, vg, pool):
        self.locks.append((vg, pool))
        return PoolLock(self)

    def execute(self, *cmd, **kwargs):
        cmd = cmd[len(privileged.ENV_PREFIX):]
        self.commands.append(cmd)
        if cmd[:2] == ('dmsetup', 'message'):
            self.assertTrue(self.holding, 'pool message outside its lock')
            if cmd[-1] == 'reserve_metadata_snap':
                self.assertTrue(self.maps.recorded(self.pool.pool),
                                'reserved before it was recorded')
        out = self.pool.run(cmd)
        self.assertIsNotNone(out, cmd)
        return out

    def decode(self, token):
        return thin.decode_regions(token, SECTORS // REGION, REGION)

    def test_map_of_a_thin_lv(self):
        token = self.maps.take(LV, SECTORS, REGION)
        self.assertEqual([(0, 2), (9, 10)], self.decode(token))
        self.assertEqual(['thin_device', 'thin_table', 'thin_status',
                          'table', 'reserve_metadata_snap', 'thin_dump',
                          'release_metadata_snap'], self.pool.calls)
        self.assertEqual([(VG, 'cinder-volumes-pool')], self.locks)
        self.assertFalse(self.pool.held)
        self.assertEqual([], self.maps.recorded_pools())

    def test_zeroing_map_of_a_thin_lv_in_a_zeroing_pool(self):
        device_map = self.maps.zeroing_map(LV)
        self.assertEqual(((0, 2), (9, 10)), device_map.ranges)
        self.assertEqual(128, device_map.block_sectors)
        self.assertEqual([(VG, 'cinder-volumes-pool')], self.locks)
        self.assertFalse(self.pool.held)

    def test_no_zeroing_map_where_a_new_block_shows_old_data(self):
        # (skip_block_zeroing: a block mapped later reads what it held.)
        self.pool.zeroing = False
        self.assertIsNone(self.maps.zeroing_map(LV))
        self.assertFalse(self.pool.held)

    def test_no_zeroing_map_of_a_thick_lv_nor_on_a_failure(self):
        self.assertIsNone(self.maps.zeroing_map('volume-thick'))
        self.pool.external.add(LV)
        self.assertIsNone(self.maps.zeroing_map(LV))
        self.pool.external.clear()
        self.pool.fail_on['thin_dump'] = processutils.ProcessExecutionError(
            exit_code=1, stderr='bad checksum')
        self.assertIsNone(self.maps.zeroing_map(LV))
        del self.pool.fail_on['thin_dump']
        self.pool.fail_on['table'] = processutils.ProcessExecutionError(
            exit_code=1, stderr='No such device or address')
        self.assertIsNone(self.maps.zeroing_map(LV))
        self.assertFalse(self.pool.held)
        self.assertEqual([], self.maps.recorded_pools())

    def test_thick_lv_has_no_map(self):
        self.assertIsNone(self.maps.take('volume-thick', SECTORS, REGION))
        self.assertEqual(['thin_device'], self.pool.calls)

    def test_external_origin_means_no_map(self):
        # (Where its pool maps nothing it reads the origin, not zeroes.)
        self.pool.external.add(LV)
        self.assertIsNone(self.maps.take(LV, SECTORS, REGION))
        self.assertEqual(['thin_device', 'thin_table'], self.pool.calls)
        self.assertFalse(self.pool.held)

    def test_inactive_lv_means_no_map(self):
        self.pool.fail_on['thin_table'] = processutils.ProcessExecutionError(
            exit_code=1, stderr='Device does not exist.\nCommand failed.')
        self.assertIsNone(self.maps.take(LV, SECTORS, REGION))

    def test_lvs_failure_means_no_map(self):
        self.pool.fail_on['thin_device'] = processutils.ProcessExecutionError(
            exit_code=5, stderr='Volume group "x" not found')
        self.assertIsNone(self.maps.take(LV, SECTORS, REGION))

    def test_dump_failure_releases_and_means_no_map(self):
        self.pool.fail_on['thin_dump'] = processutils.ProcessExecutionError(
            exit_code=1, stderr='bad checksum')
        self.assertIsNone(self.maps.take(LV, SECTORS, REGION))
        self.assertFalse(self.pool.held)
        self.assertEqual([], self.maps.recorded_pools())

    # R11-7: what a map costs is bounded before thin_dump runs (the thin
    # LV's mapped blocks bound its mappings) and while it is read (a byte
    # cap on its output): a tenant decides how fragmented its LV is.
    def test_more_blocks_than_allowed_means_no_map_and_no_dump(self):
        maps = self.new_maps(max_mappings=2)   # the LV maps 3 blocks
        with self.assertLogs(region_map.LOG.logger, 'INFO') as logs:
            self.assertIsNone(maps.take(LV, SECTORS, REGION))
        self.assertEqual(['thin_device', 'thin_table', 'thin_status',
                          'table'], self.pool.calls)
        self.assertEqual([], self.locks)
        self.assertIn('dmclone_thin_map_max_mappings', '\n'.join(
            logs.output))

    def test_as_many_blocks_as_allowed_is_mapped(self):
        maps = self.new_maps(max_mappings=3)
        self.assertEqual([(0, 2), (9, 10)],
                         self.decode(maps.take(LV, SECTORS, REGION)))

    def test_the_mapped_blocks_bound_counts_the_pools_chunks(self):
        # 3 blocks of 1024 sectors: 3 mappings at most, not 24.
        self.pool.block_sectors = 1024
        maps = self.new_maps(max_mappings=3)
        self.assertIsNotNone(maps.take(LV, 3 * 1024 * 4, 1024))

    def test_a_dump_beyond_its_byte_cap_means_no_map(self):
        # (A dump that outgrows what its mappings can take: only its cap
        # is read, the snapshot is released.)
        maps = self.new_maps(max_mappings=3)
        self.pool.dump_padding = thin.dump_bytes_bound(3) + 1
        self.assertIsNone(maps.take(LV, SECTORS, REGION))
        self.assertFalse(self.pool.held)
        self.assertEqual([], maps.recorded_pools())
        self.assertEqual('release_metadata_snap', self.pool.calls[-1])

    def test_a_status_that_cannot_be_read_means_no_map(self):
        self.pool.fail_on['thin_status'] = processutils.ProcessExecutionError(
            exit_code=1, stderr='Device does not exist.\nCommand failed.')
        self.assertIsNone(self.maps.take(LV, SECTORS, REGION))
        self.assertEqual([], self.locks)

    def test_lock_failure_means_no_map(self):
        def broken(*args):
            raise RuntimeError('coordination backend down')
        self.maps._lock = broken
        self.assertIsNone(self.maps.take(LV, SECTORS, REGION))
        self.assertEqual(['thin_device', 'thin_table', 'thin_status',
                          'table'], self.pool.calls)

    def test_another_tools_snapshot_is_left_alone(self):
        self.pool.held = True
        self.assertIsNone(self.maps.take(LV, SECTORS, REGION))
        self.assertTrue(self.pool.held)
        self.assertEqual(['thin_device', 'thin_table', 'thin_status',
                          'table', 'reserve_metadata_snap'], self.pool.calls)
        self.assertEqual([], self.maps.recorded_pools())

    def test_our_leftover_snapshot_is_released_and_taken_again(self):
        # A crash between reserve and release: the record and the
        # snapshot outlive it.
        self.maps._write_record(self.pool.pool)
        self.pool.held = True
        token = self.maps.take(LV, SECTORS, REGION)
        self.assertEqual([(0, 2), (9, 10)], self.decode(token))
        self.assertEqual(['thin_device', 'thin_table', 'thin_status',
                          'table', 'reserve_metadata_snap',
                          'release_metadata_snap',
                          'reserve_metadata_snap', 'thin_dump',
                          'release_metadata_snap'], self.pool.calls)
        self.assertFalse(self.pool.held)
        self.assertEqual([], self.maps.recorded_pools())

    def test_a_record_without_a_snapshot_is_harmless(self):
        # A crash after the record was written, before the reserve.
        self.maps._write_record(self.pool.pool)
        self.assertIsNotNone(self.maps.take(LV, SECTORS, REGION))
        self.assertEqual([], self.maps.recorded_pools())

    def test_reserve_refused_otherwise_forgets_its_record(self):
        self.pool.fail_on['reserve_metadata_snap'] = \
            processutils.ProcessExecutionError(exit_code=99,
                                               stderr='Unauthorized')
        self.assertIsNone(self.maps.take(LV, SECTORS, REGION))
        self.assertEqual([], self.maps.recorded_pools())

    def test_a_snapshot_released_under_the_dump_means_no_map(self):
        # Someone released the pool's snapshot while thin_dump read it
        # (review 32 H1: another node name's start or abandon-source on a
        # pool two services share): the dump may have walked blocks the
        # live pool freed and reused, so the map is not used.
        execute = self.execute

        def released_during_the_dump(*cmd, **kwargs):
            out = execute(*cmd, **kwargs)
            if 'thin_dump' in cmd:
                self.pool.held = False
            return out
        self.maps = region_map.ThinMaps(
            'node-a', VG, self.dir, execute=released_during_the_dump,
            root_helper='rw', lock=self.lock)
        self.assertIsNone(self.maps.take(LV, SECTORS, REGION))
        self.assertIsNone(self.maps.zeroing_map(LV))
        self.assertFalse(self.pool.held)
        self.assertEqual([], self.maps.recorded_pools())

    def test_root_never_writes_a_record_through_a_planted_link(self):
        # Review 32: abandon-source runs as root; the record directory
        # belongs to the service's user, who could plant a link where a
        # record goes.  Root neither writes through it nor gives its
        # target away.
        os.makedirs(self.dir)
        precious = os.path.join(os.path.dirname(self.dir), 'precious')
        with open(precious, 'w') as f:
            f.write('precious\n')
        os.symlink(precious, self.maps._record_path(self.pool.pool))
        self.mock_object(os, 'geteuid', return_value=0)
        fchown = self.mock_object(os, 'fchown')
        self.assertRaises(OSError, self.maps._write_record, self.pool.pool)
        with open(precious) as f:
            self.assertEqual('precious\n', f.read())
        fchown.assert_not_called()
        # (and a map of that pool is not taken: nothing reserved)
        self.assertIsNone(self.maps.take(LV, SECTORS, REGION))
        self.assertFalse(self.pool.held)

    def test_release_failure_keeps_the_record_for_the_start(self):
        self.pool.fail_on['release_metadata_snap'] = \
            processutils.ProcessExecutionError(exit_code=1, stderr='EIO')
        self.assertIsNone(self.maps.take(LV, SECTORS, REGION))
        self.assertTrue(self.pool.held)
        self.assertEqual([self.pool.pool], self.maps.recorded_pools())
        del self.pool.fail_on['release_metadata_snap']
        self.new_maps().release_leftovers()
        self.assertFalse(self.pool.held)
        self.assertEqual([], self.maps.recorded_pools())

    def test_start_releases_only_recorded_pools(self):
        self.maps._write_record(self.pool.pool)
        self.pool.held = True
        other = fakes.FakeThinPool('other-vg')
        other.held = True
        self.new_maps().release_leftovers()
        self.assertFalse(self.pool.held)
        self.assertTrue(other.held)
        self.assertEqual([], self.maps.recorded_pools())

    def test_start_without_records_runs_nothing(self):
        self.maps.release_leftovers()
        self.assertEqual([], self.commands)

    def test_start_failure_is_retried_later(self):
        self.maps._write_record(self.pool.pool)
        self.pool.held = True
        self.pool.fail_on['release_metadata_snap'] = \
            processutils.ProcessExecutionError(exit_code=1, stderr='EIO')
        self.maps.release_leftovers()
        self.assertEqual([self.pool.pool], self.maps.recorded_pools())

    def test_records_of_other_groups_and_junk_are_ignored(self):
        os.makedirs(self.dir)
        other = region_map.ThinMaps('node-a', 'other-vg', self.dir,
                                    execute=self.execute, lock=self.lock)
        other._write_record('other-vg-pool')
        for name, text in (('junk.metasnap', 'a b c'),
                           ('evil.metasnap', '%s ../x' % VG),
                           ('renamed.metasnap', '%s %s-pool' % (VG, VG)),
                           ('notes.txt', 'x')):
            with open(os.path.join(self.dir, name), 'w') as f:
                f.write(text)
        self.assertEqual([], self.maps.recorded_pools())
        self.assertEqual(['other-vg-pool'], other.recorded_pools())

    def test_a_fifo_where_a_record_goes_is_refused_at_once(self):
        # (an open for writing of a FIFO nobody reads would wait)
        os.makedirs(self.dir)
        os.mkfifo(self.maps._record_path(self.pool.pool))
        self.assertRaises(OSError, self.maps._write_record, self.pool.pool)
        self.assertIsNone(self.maps.take(LV, SECTORS, REGION))
        self.assertFalse(self.pool.held)

    def test_links_and_fifos_among_the_records_are_never_read(self):
        # Review 32 (LOW): root's abandon-source lists the records too; a
        # FIFO planted as a record would block it for good, a link to a
        # device or a huge file would be read whole.  Only plain files
        # are read, never through a link.
        os.makedirs(self.dir)
        record = os.path.basename(self.maps._record_path(self.pool.pool))
        os.mkfifo(os.path.join(self.dir, record))
        target = os.path.join(os.path.dirname(self.dir), 'elsewhere')
        with open(target, 'w') as f:
            f.write('%s %s node-a\n' % (VG, self.pool.pool))
        os.symlink(target, os.path.join(self.dir, 'cinder--volumes-x'
                                        '.node-a.metasnap'))
        self.assertEqual([], self.maps.recorded_pools())
        os.unlink(os.path.join(self.dir, record))
        os.symlink(target, os.path.join(self.dir, record))
        self.assertEqual([], self.maps.recorded_pools())

    def test_names_are_checked(self):
        self.assertRaises(exception.InvalidDMName, region_map.ThinMaps,
                          'node-a', '../vg', self.dir)

    def test_start_survives_a_record_dir_it_cannot_list(self):
        # R10-1: <state_path>/dmclone is shared with the operator command
        # cinder-dmclone (run as root, which creates it with root's umask)
        # and anything else may stand at that path: release_leftovers
        # runs at every start, also with dmclone_thin_map off, and must
        # never fail the start.
        for error in (PermissionError(13, 'Permission denied'),
                      NotADirectoryError(20, 'Not a directory')):
            self.mock_object(os, 'listdir', side_effect=error)
            self.maps.release_leftovers()
            self.assertEqual([], self.commands)

    def test_start_survives_a_file_where_the_record_dir_should_be(self):
        with open(self.dir, 'w') as f:
            f.write('not a directory\n')
        self.maps.release_leftovers()
        self.assertEqual([], self.commands)

    def test_a_table_that_does_not_parse_means_no_map(self):
        # R10-2: the map is an optimisation; a failure to take it copies
        # every region, it never refuses the move.
        self.pool._thin_table = lambda cmd, lvs: ('garbage\n', '')
        self.assertIsNone(self.maps.take(LV, SECTORS, REGION))
        self.assertFalse(self.pool.held)

    def test_an_lv_name_device_mapper_refuses_means_no_map(self):
        self.mock_object(privileged, 'thin_table', side_effect=(
            exception.InvalidDMName(value='x', reason='too long')))
        self.assertIsNone(self.maps.take(LV, SECTORS, REGION))

    def test_a_map_that_does_not_encode_means_no_map(self):
        self.mock_object(thin, 'encode_regions', side_effect=(
            exception.RegionMapInvalid(value='x', reason='broken')))
        self.assertIsNone(self.maps.take(LV, SECTORS, REGION))
        self.assertFalse(self.pool.held)
        self.assertEqual([], self.maps.recorded_pools())


class SharedPoolTestCase(test.TestCase):
    """Two volume services of one kernel reading one thin pool.

    Review 32 (left open then): the pool's lock named the node, so two
    services sharing a volume group under two node names (two backends
    with their own ``backend_host``) took different locks.  The second,
    holding a stale record of its own (it crashed between a reserve and
    its release), took the pool's held snapshot for its leftover while
    the first's ``thin_dump`` read it: it released it, reserved its own
    and dumped; the first's release then found a snapshot held (the
    second's) and kept a map read from a snapshot released under it,
    whose walked blocks the live pool may have reused: regions holding
    data taken as unneeded, zeroes on the destination.  The pool is the
    kernel's, so its lock is the kernel's too, whatever the node names.
    """

    def setUp(self):
        super().setUp()
        self.dir, self.pool = state_and_pool(self)
        self.pool.add('volume-2', [(5, 6)])
        self.locks = {}
        self.guard = threading.Lock()
        self.mock_object(coordination.COORDINATOR, 'get_lock',
                         side_effect=self.named_lock)
        #: (service, pool message or thin_dump) tried, in the kernel's order.
        self.log = []

    def named_lock(self, name):
        with self.guard:
            return self.locks.setdefault(name, ToozLikeLock())

    def maps(self, node, hook=None):
        def execute(*cmd, **kwargs):
            cmd = cmd[len(privileged.ENV_PREFIX):]
            with self.guard:
                if cmd[0] == 'thin_dump' or cmd[:2] == ('dmsetup',
                                                        'message'):
                    self.log.append((node, cmd[-1] if cmd[0] == 'dmsetup'
                                     else 'thin_dump'))
                out = self.pool.run(cmd)
            if hook is not None and cmd[0] == 'thin_dump':
                hook()
            return out
        return region_map.ThinMaps(node, VG, self.dir, execute=execute,
                                   root_helper='rw')

    def test_a_stale_record_never_releases_anothers_live_snapshot(self):
        other = self.maps('node-a.example.org')
        other._write_record(self.pool.pool)        # its crash's leftover
        result = {}

        def second_service():
            result['token'] = other.take('volume-2', SECTORS, REGION)

        def during_the_first_dump():
            thread = threading.Thread(target=second_service)
            thread.start()
            # The second service runs to its end, or waits for the pool.
            thread.join(5)
            result['thread'] = thread
        first = self.maps('node-a', hook=during_the_first_dump)
        token = first.take(LV, SECTORS, REGION)
        result['thread'].join(30)
        self.assertFalse(result['thread'].is_alive())
        mine = [i for i, (who, _) in enumerate(self.log) if who == 'node-a']
        self.assertEqual(
            [], [e for e in self.log[mine[0]:mine[-1]]
                 if e[0] != 'node-a'],
            'the other service touched the pool\'s snapshot while the '
            'first read it: %s' % self.log)
        self.assertEqual([(0, 2), (9, 10)], thin.decode_regions(
            token, SECTORS // REGION, REGION))
        self.assertEqual([(5, 6)], thin.decode_regions(
            result['token'], SECTORS // REGION, REGION))
        self.assertFalse(self.pool.held)


class ToozLikeLock(object):
    """threading.Lock with tooz's ``acquire(blocking=<seconds>)``."""

    def __init__(self):
        self._lock = threading.Lock()

    def acquire(self, blocking=True):
        if blocking is True:
            return self._lock.acquire()
        if not blocking:
            return self._lock.acquire(False)
        return self._lock.acquire(timeout=blocking)

    def release(self):
        self._lock.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


class PoolLockWaitTestCase(test.TestCase):
    """A pool's lock held for good never holds its readers for good.

    Review 32 (left open then): the map's readers waited for the pool's
    lock without a bound.  Whatever holds it (another service's dump
    stuck on a failing disk, a coordination backend that never answers
    the release) would hold a move's prepare, a service's start, or the
    operator's ``abandon-source``, past every deadline.  A map not taken
    costs a full copy, and zeroes written over every range: never data.
    """

    #: the pool's lock, as a tooz driver behaves
    lock_class = ToozLikeLock

    def setUp(self):
        super().setUp()
        self.dir, self.pool = state_and_pool(self)
        self.held = self.lock_class()
        self.held.acquire()
        self.addCleanup(self.held.release)

        def execute(*cmd, **kwargs):
            return self.pool.run(cmd[len(privileged.ENV_PREFIX):])
        self.maps = region_map.ThinMaps(
            'node-a', VG, self.dir, execute=execute, root_helper='rw',
            lock=lambda vg, pool: self.held, lock_wait=0.2)

    def bounded(self, fn, *args):
        """fn(*args) in a thread that must end within 30 s; its result."""
        result = []
        thread = threading.Thread(target=lambda: result.append(fn(*args)),
                                  daemon=True)
        thread.start()
        thread.join(30)
        self.assertFalse(thread.is_alive(), '%s waited for the pool\'s '
                         'lock without a bound' % fn.__name__)
        return result[0]

    def test_no_map_rather_than_waiting_for_good(self):
        self.assertIsNone(self.bounded(self.maps.take, LV, SECTORS, REGION))
        self.assertIsNone(self.bounded(self.maps.zeroing_map, LV))
        self.assertNotIn('reserve_metadata_snap', self.pool.calls)

    def test_a_start_goes_on_and_keeps_the_record(self):
        self.maps._write_record(self.pool.pool)
        self.pool.held = True
        self.bounded(self.maps.release_leftovers)
        self.assertTrue(self.pool.held)
        self.assertEqual([self.pool.pool], self.maps.recorded_pools())

    def test_a_free_lock_is_taken_and_given_back(self):
        self.held.release()
        self.addCleanup(self.held.acquire)
        self.assertEqual([(0, 2), (9, 10)], thin.decode_regions(
            self.bounded(self.maps.take, LV, SECTORS, REGION),
            SECTORS // REGION, REGION))
        self.assertTrue(self.held.acquire(False))
        self.held.release()

    def test_the_wait_leaves_the_dump_half_the_maps_budget(self):
        # (A wait of the whole budget, then a dump, would pass the
        # move's recorded deadline: its commit refused, the move given
        # up.  Review of 9e1ea8b.)
        self.assertLessEqual(2 * region_map.ThinMaps.LOCK_WAIT,
                             region_map.ThinMaps.TIME_LIMIT)
        self.assertEqual(region_map.ThinMaps.LOCK_WAIT,
                         region_map.ThinMaps('node-a', VG,
                                             self.dir).lock_wait)

    def test_the_operators_command_waits_for_a_dump_that_ends(self):
        # lock_wait None (cinder-dmclone move abandon-source): without the
        # map it would zero every range never copied, mapping a thin LV
        # whole into a pool that may be over-committed.
        release = threading.Timer(0.6, self.held.release)
        release.start()
        self.addCleanup(self.held.acquire)
        self.addCleanup(release.cancel)
        self.maps.lock_wait = None
        self.assertIsNotNone(self.bounded(self.maps.zeroing_map, LV))


class EtcdLikeLock(ToozLikeLock):
    """tooz's etcd3gw lock: a bounded wait that runs out raises.

    Its ``acquire(blocking=<seconds>)`` retries through tenacity, which
    raises RetryError when the seconds are spent (so do tooz's mysql,
    pgsql and memcached locks), where file and redis answer False.
    """

    def acquire(self, blocking=True):
        got = super().acquire(blocking)
        if not got and blocking not in (False, True):
            raise tenacity.RetryError(last_attempt=None)
        return got


class EtcdWaitTestCase(PoolLockWaitTestCase):
    """The same bounded waits with etcd3gw's lock, and a clear reason.

    Review of 9e1ea8b (LOW): its wait that ran out raised tenacity's
    RetryError, logged as a traceback that says nothing of a lock.
    """

    lock_class = EtcdLikeLock

    def assert_times_out(self):
        with testtools.ExpectedException(exception.PoolLockTimeout):
            with self.maps._pool_lock(self.pool.pool):
                self.fail('the lock was held')

    def test_a_wait_that_ran_out_is_a_lock_timeout(self):
        self.assert_times_out()

    def test_zookeepers_wait_that_ran_out_is_a_lock_timeout(self):
        # kazoo's LockTimeout (tooz does not translate it); kazoo is not
        # among our requirements, so a stand-in module plays it.
        # (Review of e7b8cc7.)
        kazoo = types.ModuleType('kazoo')
        kazoo.exceptions = types.ModuleType('kazoo.exceptions')

        class LockTimeout(Exception):
            pass
        kazoo.exceptions.LockTimeout = LockTimeout
        self.useFixture(fixtures.MonkeyPatch('sys.modules', dict(
            sys.modules, kazoo=kazoo, **{'kazoo.exceptions':
                                         kazoo.exceptions})))
        self.mock_object(self.held, 'acquire',
                         side_effect=[False, LockTimeout('30 s')])
        self.assert_times_out()

    def test_a_failed_backend_is_not_a_timeout(self):
        # (Only the wait's end is the timeout; the backend's own failure
        # keeps its type and message.)
        error = RuntimeError('etcd unreachable')
        self.mock_object(self.held, 'acquire', side_effect=[False, error])
        with testtools.ExpectedException(RuntimeError, 'etcd unreachable'):
            with self.maps._pool_lock(self.pool.pool):
                pass


class LeaseLock(object):
    """A tooz lease lock (etcd3gw, redis): it can run out while held.

    :meth:`expire`: the lease ran out (a starved heartbeat, the backend
    out of reach longer than its lock timeout); another may take it, and
    :meth:`release` answers False, as those drivers do for a lock that
    is no longer theirs.
    """

    def __init__(self, registry, name):
        self.registry = registry
        self.name = name

    def acquire(self, blocking=True):
        deadline = time.monotonic() + (3600 if blocking is True
                                       else float(blocking or 0))
        while True:
            with self.registry['guard']:
                if self.registry.get(self.name) is None:
                    self.registry[self.name] = self
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def expire(self):
        with self.registry['guard']:
            if self.registry.get(self.name) is self:
                self.registry[self.name] = None

    def release(self):
        with self.registry['guard']:
            if self.registry.get(self.name) is self:
                self.registry[self.name] = None
                return True
            return False


class LostLockTestCase(SharedPoolTestCase):
    """A map read while the pool's lock ran out is never used.

    Review of 05838fe: the kernel's lock keeps the two services apart
    only while it is held.  A lease that ran out during the first's
    dump let the second (a stale record of its own) release the
    snapshot being dumped and take its own; the first's release then
    found a snapshot held and kept its torn map.  tooz said so: the
    lock's release answered False.
    """

    def setUp(self):
        super().setUp()
        registry = {'guard': threading.Lock()}
        self.made = []

        def get_lock(name):
            self.made.append(LeaseLock(registry, name))
            return self.made[-1]
        self.mock_object(coordination.COORDINATOR, 'get_lock',
                         side_effect=get_lock)

    def test_a_map_read_after_the_lock_ran_out_is_not_used(self):
        first_done = threading.Event()
        other_dumping = threading.Event()

        def other_dump():
            other_dumping.set()
            first_done.wait(10)
        other = self.maps('node-a.example.org', hook=other_dump)
        other._write_record(self.pool.pool)        # its crash's leftover
        result = {}
        thread = threading.Thread(target=lambda: result.setdefault(
            'other', other.take('volume-2', SECTORS, REGION)))

        def during_the_first_dump():
            self.made[0].expire()
            thread.start()
            self.assertTrue(other_dumping.wait(10))
        first = self.maps('node-a', hook=during_the_first_dump)
        token = first.take(LV, SECTORS, REGION)
        first_done.set()
        thread.join(30)
        self.assertFalse(thread.is_alive())
        # (the interleaving happened: the other released and reserved
        # while the first dumped)
        mine = [i for i, (who, _) in enumerate(self.log) if who == 'node-a']
        self.assertNotEqual([], [e for e in self.log[mine[0]:mine[-1]]
                                 if e[0] != 'node-a'], self.log)
        self.assertIsNone(token, 'a torn map was used: %s' % (self.log,))
        # The first's release, made once its lock was the other's, freed
        # the other's snapshot under its dump: the other's release finds
        # none held, and its map is not used either.
        self.assertIsNone(result['other'])
        self.assertFalse(self.pool.held)
