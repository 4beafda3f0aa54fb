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

"""The Cinder-facing driver, with the kernel replaced by fakes."""

import logging
import os
from unittest import mock

import ddt
import fixtures
from oslo_concurrency import processutils

from cinder.brick.local_dev import lvm as brick_lvm
from cinder import context
from cinder import exception
from cinder.interface import volume_driver
from cinder.interface import volume_manageable_driver
from cinder.interface import volume_snapshot_revert
from cinder.interface import volume_snapshotmanagement_driver
from cinder import objects
from cinder.tests.unit import fake_constants as fake
from cinder.tests.unit import fake_snapshot
from cinder.tests.unit import fake_volume
from cinder.tests.unit import test
from cinder.tests.unit import utils as tests_utils
from cinder.volume import configuration as conf
from cinder.volume import driver as volume_driver_module
from cinder.volume.drivers import lvm as cinder_lvm
from cinder.volume import manager as volume_manager
from cinder.volume import volume_utils

from cinder_dmclone import dmsetup
from cinder_dmclone import driver
from cinder_dmclone import exception as dmc_exception
from cinder_dmclone import hydration
from cinder_dmclone import map_mark
from cinder_dmclone import opts
from cinder_dmclone import privileged
from cinder_dmclone import region_map
from cinder_dmclone import thin
from tests.unit import fakes

VG = 'dmc-vg'
LV = 'volume-%s' % fake.VOLUME_ID
LV_PATH = '/dev/%s/%s' % (VG, LV)
HANDLE = 'dmclone-dmc--vg-' + LV
HANDLE_PATH = '/dev/mapper/' + HANDLE
LOCAL = {'host': 'node-a', 'initiator': 'iqn.2024-01.org.example.a:i'}
REMOTE = {'host': 'node-b', 'initiator': 'iqn.2024-01.org.example.b:i',
          'ip': '10.0.0.2'}
GIB = 1024 ** 3
#: LVM's report of a 100 GiB thin pool, 40 % of its data and 10 % of its
#: 100 MiB of metadata used, two thin volumes of 50 and 30 GiB, a clone's
#: thick metadata LV (as test_thin's).
THIN_REPORT = '\n'.join([
    '  dmc-vg-pool|%d|40.00|10.00|%d|65536|' % (100 * GIB, 100 * 1024 ** 2),
    '  volume-1|%d|25.00|||0|dmc-vg-pool' % (50 * GIB),
    '  volume-2|%d|100.00|||0|dmc-vg-pool' % (30 * GIB),
    '  volume-2-dmcmeta|%d|||||' % (8 * 1024 ** 2)])


GROUP = 'dmclone-test'
SHARED_LOCKS = 'etcd3+http://192.0.2.10:2379?api_version=v3'
DEFAULTS = dict(volume_group=VG, target_helper='fake', lvm_type='default',
                volume_clear='none', volume_backend_name='dmclone',
                lvm_conf_file='None', target_ip_address='10.0.0.1',
                target_prefix='iqn.2010-10.org.openstack:')


def make_configuration(test_case, **overrides):
    """A backend section with every option the driver reads registered."""
    configuration = conf.Configuration(opts.dmclone_opts,
                                       config_group=GROUP)
    configuration.append_config_values(cinder_lvm.volume_opts)
    configuration.append_config_values(volume_driver_module.volume_opts)
    # Every node's services share one coordination backend (the driver
    # refuses node-local locks).
    test_case.override_config('backend_url', SHARED_LOCKS,
                              group='coordination')
    values = dict(DEFAULTS)
    values.update(overrides)
    for key, value in values.items():
        test_case.override_config(key, value, group=GROUP)
    return configuration


class DriverTestBase(test.TestCase):

    def setUp(self):
        super().setUp()
        self.ctxt = context.get_admin_context()
        self.configuration = make_configuration(self)
        self.vg = mock.Mock(spec=brick_lvm.LVM)
        self.vg.vg_name = VG
        self.lvs = {LV: '1.00'}
        self.vg.get_volume.side_effect = lambda name: (
            {'name': name, 'size': self.lvs[name]} if name in self.lvs
            else None)
        self.vg.lv_has_snapshot.return_value = False
        self.vg.lv_is_open.return_value = False
        self.vg.get_volumes.return_value = []
        #: LVM's own listing (privileged.vg_lv_names) of any group: the
        #: LVs of self.lvs.
        self.vg_lv_names = self.mock_object(
            privileged, 'vg_lv_names',
            side_effect=lambda vg, **kwargs: frozenset(self.lvs))
        self.drv = self._make_driver()
        self.dm = fakes.FakeDMSetup(sizes={LV_PATH: 2097152})
        self.drv.dm = self.dm
        self.volume = fake_volume.fake_volume_obj(self.ctxt, size=1)
        #: volume id -> the host its record names, as the driver reads it
        #: again (Volume.get_by_id; not in the test database): a request
        #: that serves a volume from here maps its handle only if its
        #: record names this node (_refuse_linear_over_clone).  Only the
        #: volumes listed have a record: a read of any other fails, as a
        #: read the code should not make would.
        self.records = {self.volume.id: 'node-a@dmclone#dmclone'}
        self.mock_object(objects.Volume, 'get_by_id',
                         side_effect=self._volume_record)

    def _volume_record(self, ctxt, volume_id):
        """Volume.get_by_id: a volume of self.records (not in the DB)."""
        if volume_id not in self.records:
            raise exception.VolumeNotFound(volume_id=volume_id)
        return fake_volume.fake_volume_obj(ctxt, id=volume_id, size=1,
                                           host=self.records[volume_id])

    def _make_driver(self, host='node-a@dmclone#dmclone', **overrides):
        if overrides:
            self.configuration = make_configuration(self, **overrides)
        self.db = mock.Mock()
        self.db.volume_admin_metadata_get.return_value = {}
        drv = driver.DMCloneVolumeDriver(configuration=self.configuration,
                                         vg_obj=self.vg, host=host)
        # Cinder's drivers always talk to cinder.db; keep tests off it.
        drv.db = drv.store.db = self.db
        return drv

    def _snapshot(self):
        return fake_snapshot.fake_snapshot_obj(self.ctxt, volume_size=1,
                                               volume=self.volume)

    def _make_handle(self, sectors=2097152):
        self.dm.devices[HANDLE] = [
            dmsetup.linear_segment(0, sectors, LV_PATH)]


@ddt.ddt
class IdentityTestCase(DriverTestBase):

    def test_interfaces(self):
        cls = driver.DMCloneVolumeDriver
        for iface in (volume_driver.VolumeDriverCore,
                      volume_manageable_driver.VolumeListManageableDriver,
                      volume_snapshot_revert.VolumeSnapshotRevertDriver,
                      volume_snapshotmanagement_driver
                      .VolumeSnapshotManagementDriver):
            self.assertTrue(issubclass(cls, iface), iface)

    def test_node_name_from_service_host_not_gethostname(self):
        with mock.patch('socket.gethostname', return_value='wrong'):
            drv = self._make_driver(host='node-a@dmclone')
        self.assertEqual('node-a', drv.node_name)
        self.assertEqual('node-a', drv.hostname)

    def test_node_name_configured(self):
        drv = self._make_driver(dmclone_node_name='compute-7')
        self.assertEqual('compute-7', drv.node_name)

    def test_node_name_falls_back_to_conf_host(self):
        self.override_config('host', 'conf-host')
        drv = self._make_driver(host=None)
        self.assertEqual('conf-host', drv.node_name)

    def test_node_name_unlike_the_service_host_maps_handles(self):
        # dmclone_node_name (devstack's CINDER_DMCLONE_NODE_NAME) set to
        # Nova's name for the node while the service's host is node-a:
        # every volume record of this node says node-a, which is not in
        # _node_names(): no handle can be mapped any more (create,
        # ensure_export at start, local attach, extend).
        # (A local attach: Nova's connector names the node compute-7.)
        self.drv = self._make_driver(dmclone_node_name='compute-7')
        self.drv.dm = self.dm
        connector = dict(LOCAL, host='compute-7')
        self.assertEqual({}, self.drv.create_export(self.ctxt, self.volume,
                                                    connector))
        self.assertIn(HANDLE, self.dm.devices)
        self.dm.devices.clear()
        info = self.drv.initialize_connection(self.volume, connector)
        self.assertEqual(HANDLE_PATH, info['data']['device_path'])
        self.assertIn(HANDLE, self.dm.devices)
        # (And an extend, which reads the record again too.)
        self.drv.extend_volume(self.volume, 2)
        self.vg.extend_volume.assert_called_once_with(LV, '2g')

    @ddt.data(({'host': 'node-a'}, True), ({'host': 'node-b'}, False),
              ({'host': 'node-a.example.org'}, True), ({}, False),
              (None, False))
    @ddt.unpack
    def test_is_local_connector(self, connector, local):
        drv = self._make_driver(dmclone_node_aliases=['node-a.example.org'])
        self.assertEqual(local, drv._is_local_connector(connector))

    def test_driver_options(self):
        names = {o.name for o in driver.DMCloneVolumeDriver
                 .get_driver_options()}
        self.assertIn('dmclone_region_size', names)
        self.assertIn('volume_group', names)
        self.assertIn('target_helper', names)


@ddt.ddt
class SetupTestCase(DriverTestBase):

    def setUp(self):
        super().setUp()
        self.mock_object(cinder_lvm.LVMVolumeDriver, 'check_for_setup_error')
        self.mock_object(hydration.HydrationMonitor, 'start')
        self.recover = self.mock_object(driver.DMCloneVolumeDriver,
                                        '_recover_transfers')

    def test_ok(self):
        self.drv.check_for_setup_error()
        self.recover.assert_called_once_with()
        self.assertIs(self.vg, self.drv.metadata_vg)
        self.assertIsNotNone(self.drv.monitor)
        self.drv.monitor.start.assert_called_once_with()

    @ddt.data(48, 3, 100)
    def test_region_size_not_power_of_two(self, size):
        self.drv.configuration.dmclone_region_size = size
        exc = self.assertRaises(exception.InvalidConfigurationValue,
                                self.drv.check_for_setup_error)
        self.assertIn('dmclone_region_size', str(exc))

    @ddt.data('tgtadm', 'scstadmin', 'nvmet')
    def test_only_lio_exports(self, helper):
        # (A move commits once only LIO holds the source's handle.)
        self.drv.configuration.target_helper = helper
        exc = self.assertRaises(exception.InvalidConfigurationValue,
                                self.drv.check_for_setup_error)
        self.assertIn('target_helper', str(exc))

    @ddt.data('file://$state_path', 'file:///var/lib/cinder/locks',
              'FILE:///locks', 'ipc://', 'zake://', '')
    def test_node_local_coordination_refused(self, url):
        # Per-node locks do not serialise the two sides of a move: a
        # destination could drop a clone its source is committing.
        self.override_config('backend_url', url, group='coordination')
        for setup in (self.drv.check_for_setup_error,
                      lambda: self.drv.do_setup(self.ctxt)):
            exc = self.assertRaises(dmc_exception.NodeLocalCoordination,
                                    setup)
            self.assertIn('[coordination] backend_url', str(exc))
            self.assertIn('shared', str(exc))
        self.recover.assert_not_called()

    @ddt.data(('file:///shared/locks', True, True),
              ('file:///shared/locks', False, False),
              ('ipc://', True, False), ('zake://', True, False))
    @ddt.unpack
    def test_file_locks_on_a_shared_file_system(self, url, shared, ok):
        # Only file:// can be shared (a cluster file system), and only
        # when the operator says so.
        self.override_config('backend_url', url, group='coordination')
        self.drv.configuration.dmclone_shared_file_locks = shared
        for setup in (self.drv.check_for_setup_error,
                      lambda: self.drv.do_setup(self.ctxt)):
            if ok:
                setup()
            else:
                self.assertRaises(dmc_exception.NodeLocalCoordination, setup)

    @ddt.data('etcd3+http://192.0.2.10:2379', 'redis://192.0.2.10:6379',
              'zookeeper://192.0.2.10:2181', 'mysql://c:p@192.0.2.10/tooz')
    def test_shared_coordination_accepted(self, url):
        self.override_config('backend_url', url, group='coordination')
        self.drv.do_setup(self.ctxt)
        self.drv.check_for_setup_error()

    def test_region_size_checked_in_do_setup(self):
        self.drv.configuration.dmclone_region_size = 48
        self.assertRaises(exception.InvalidConfigurationValue,
                          self.drv.do_setup, self.ctxt)

    def test_do_setup_ok(self):
        self.drv.do_setup(self.ctxt)

    def test_missing_volume_group_from_cinder_checks(self):
        cinder_lvm.LVMVolumeDriver.check_for_setup_error.side_effect = (
            exception.VolumeBackendAPIException(
                data='Volume Group dmc-vg does not exist'))
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.drv.check_for_setup_error)

    @mock.patch.object(brick_lvm, 'LVM')
    def test_separate_metadata_vg(self, mock_lvm):
        self.drv.configuration.dmclone_metadata_volume_group = 'fast-vg'
        self.drv.check_for_setup_error()
        self.assertIs(mock_lvm.return_value, self.drv.metadata_vg)
        self.assertEqual('fast-vg', mock_lvm.call_args.args[0])

    @mock.patch.object(brick_lvm, 'LVM')
    def test_missing_metadata_vg_command_error(self, mock_lvm):
        self.drv.configuration.dmclone_metadata_volume_group = 'nope'
        mock_lvm.side_effect = processutils.ProcessExecutionError(
            exit_code=5, stderr='  Volume group "nope" not found\n')
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.drv.check_for_setup_error)
        self.assertIn('Metadata volume group nope', str(exc))
        self.assertIn('Volume group "nope" not found', str(exc))

    @mock.patch.object(brick_lvm, 'LVM')
    def test_missing_metadata_vg(self, mock_lvm):
        mock_lvm.side_effect = exception.VolumeGroupNotFound(vg_name='nope')
        self.drv.configuration.dmclone_metadata_volume_group = 'nope'
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.drv.check_for_setup_error)
        self.assertIn('Metadata volume group nope', str(exc))

    def test_no_dmsetup(self):
        self.dm.fail_on['version'] = dmc_exception.DMSetupCommandFailed(
            command='dmsetup version', reason='No such file or directory')
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.drv.check_for_setup_error)
        self.assertIn('device-mapper is not usable', str(exc))

    def test_no_clone_target_after_modprobe(self):
        self.dm.target_types = {'linear': 'v1.4.0'}
        execute = self.mock_object(self.drv, '_execute')
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.drv.check_for_setup_error)
        self.assertIn('no device-mapper "clone" target', str(exc))
        self.assertEqual(('/usr/bin/env', 'LC_ALL=C', 'modprobe',
                          'dm_clone'), execute.call_args.args)
        self.assertTrue(execute.call_args.kwargs['run_as_root'])

    def test_modprobe_failure_is_reported_as_missing_target(self):
        self.dm.target_types = {'linear': 'v1.4.0'}
        self.mock_object(self.drv, '_execute', side_effect=OSError('nope'))
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.drv.check_for_setup_error)

    @ddt.data(
        (1, 'modprobe: FATAL: Module dm_clone not found in directory '
            '/lib/modules/6.1.0-13-amd64', logging.WARNING,
         'The running kernel has no dm_clone module'),
        (1, "modprobe: ERROR: could not insert 'dm_clone': Operation not "
            "permitted", logging.WARNING,
         'Could not load the dm_clone kernel module'),
        (99, 'cinder-rootwrap: Unauthorized command: /usr/bin/env LC_ALL=C '
             'modprobe dm_clone (no filter matched)', logging.ERROR,
         'install the dmclone.filters of this release'))
    @ddt.unpack
    def test_modprobe_failures_are_told_apart(self, code, stderr, level,
                                              told):
        self.dm.target_types = {'linear': 'v1.4.0'}
        self.mock_object(
            self.drv, '_execute',
            side_effect=processutils.ProcessExecutionError(
                exit_code=code, stderr=stderr))
        log = self.useFixture(fixtures.FakeLogger(
            level=logging.WARNING, format='%(levelname)s %(message)s'))
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.drv.check_for_setup_error)
        self.assertIn('no device-mapper "clone" target', str(exc))
        records = [r for r in log.output.splitlines() if told in r]
        self.assertEqual(1, len(records), log.output)
        self.assertTrue(records[0].startswith(
            logging.getLevelName(level) + ' '), records[0])
        self.assertIn(stderr, records[0])

    def test_modprobe_bug_is_not_swallowed(self):
        self.dm.target_types = {'linear': 'v1.4.0'}
        self.mock_object(self.drv, '_execute', side_effect=TypeError('bug'))
        self.assertRaises(TypeError, self.drv.check_for_setup_error)

    def test_clone_target_loaded_by_modprobe(self):
        self.dm.target_types = {'linear': 'v1.4.0'}

        def load(*args, **kwargs):
            self.dm.target_types['clone'] = 'v1.0.0'
        self.mock_object(self.drv, '_execute', side_effect=load)
        self.drv.check_for_setup_error()

    def test_thin_map_off_by_default(self):
        self.assertIsNone(self.drv.moves.source.thin_maps)
        self.assertFalse(self.drv.moves.destination.thin_map)
        self.assertFalse(self.drv.moves.destination.clones.thin_map)

    def test_thin_map_on_both_sides(self):
        drv = self._make_driver(dmclone_thin_map=True)
        maps = drv.moves.source.thin_maps
        self.assertIsInstance(maps, region_map.ThinMaps)
        self.assertTrue(drv.moves.destination.thin_map)
        # (and the space check counts what the maps copy)
        self.assertTrue(drv.moves.destination.clones.thin_map)
        self.assertEqual(VG, maps.vg_name)
        # (thin_dump read as it comes, bounded: R11-7)
        self.assertIs(privileged.stream_output, maps._stream)
        self.assertEqual(1000000, maps.max_mappings)
        drv = self._make_driver(dmclone_thin_map=True,
                                dmclone_thin_map_max_mappings=5)
        self.assertEqual(5, drv.moves.source.thin_maps.max_mappings)
        self.assertEqual('node-a', maps.node_name)
        self.assertEqual(os.path.join(driver.CONF.state_path, 'dmclone'),
                         maps.record_dir)

    def test_thin_mapped_marks_under_the_state_dir_even_when_off(self):
        # (A clone mapped before the option was turned off keeps its
        # guard after a restart.)
        for on in (True, False):
            drv = self._make_driver(dmclone_thin_map=on)
            marks = drv.moves.destination.marks
            self.assertIsInstance(marks, map_mark.MapMarks)
            self.assertEqual(os.path.join(driver.CONF.state_path, 'dmclone',
                                          'thin-mapped', 'node-a'),
                             marks.directory)

    def test_start_releases_snapshots_left_held_even_when_off(self):
        release = self.mock_object(region_map.ThinMaps, 'release_leftovers')
        self.drv.check_for_setup_error()
        release.assert_called_once_with()

    def test_monitor_started_once(self):
        self.drv.check_for_setup_error()
        monitor = self.drv.monitor
        self.drv.check_for_setup_error()
        self.assertIs(monitor, self.drv.monitor)


class SetupWithCinderChecksTestCase(DriverTestBase):
    """Cinder's own LVM checks run too (volume group lookup)."""

    @mock.patch.object(driver.DMCloneVolumeDriver, '_recover_transfers')
    @mock.patch.object(hydration.HydrationMonitor, 'start')
    @mock.patch.object(volume_utils, 'get_all_volume_groups',
                       return_value=[{'name': VG}])
    def test_parent_checks_run(self, mock_vgs, mock_start, mock_recover):
        self.drv.check_for_setup_error()
        mock_vgs.assert_called_once_with(VG)


class HandleTestCase(DriverTestBase):

    def test_create_volume_makes_handle(self):
        self.drv.create_volume(self.volume)
        self.vg.create_volume.assert_called_once_with(LV, '1g', 'default', 0)
        self.assertEqual([dmsetup.linear_segment(0, 2097152, LV_PATH)],
                         self.dm.devices[HANDLE])
        self.assertEqual('DMCLONE-' + HANDLE, self.dm.uuids[HANDLE])

    def test_create_volume_rolls_back_lv_when_handle_fails(self):
        self.dm.fail_on['create'] = dmc_exception.DMSetupCommandFailed(
            command='dmsetup create', reason='boom')
        self.assertRaises(dmc_exception.DMSetupCommandFailed,
                          self.drv.create_volume, self.volume)
        self.vg.delete.assert_called_once_with(LV)
        self.assertNotIn(HANDLE, self.dm.devices)

    def test_ensure_handle_race_lost_is_fine(self):
        real_create = self.dm.create

        def racing(name, segments, uuid):
            real_create(name, segments, uuid)      # the other creator
            raise dmc_exception.DMSetupCommandFailed(command='create',
                                                     reason='busy')
        self.dm.create = racing
        self.assertEqual(HANDLE_PATH, self.drv._ensure_handle(self.volume))

    def test_ensure_handle_is_idempotent(self):
        self.drv._ensure_handle(self.volume)
        self.drv._ensure_handle(self.volume)
        self.assertEqual(1, [c[0] for c in self.dm.calls].count('create'))
        self.assertNotIn('load', [c[0] for c in self.dm.calls])

    def test_ensure_handle_fixes_stale_length(self):
        self._make_handle(sectors=1024)
        self.drv._ensure_handle(self.volume)
        self.assertEqual(2097152,
                         dmsetup.table_length(self.dm.devices[HANDLE]))

    def test_ensure_handle_leaves_clone_tables_alone(self):
        clone = [dmsetup.clone_segment(0, 1024, '/dev/m', LV_PATH,
                                       '/dev/sdb', 128)]
        self.dm.devices[HANDLE] = clone
        self.drv._ensure_handle(self.volume)
        self.assertEqual(clone, self.dm.devices[HANDLE])

    def test_handle_path(self):
        self.assertEqual(HANDLE_PATH, self.drv.handle_path(self.volume))

    def test_bad_volume_name_never_reaches_a_command(self):
        volume = fake_volume.fake_volume_obj(self.ctxt, size=1)
        volume.display_name = 'x'
        with mock.patch.object(type(volume), 'name',
                               new_callable=mock.PropertyMock,
                               return_value='volume-$(reboot)'):
            self.assertRaises(dmc_exception.InvalidDMName,
                              self.drv._ensure_handle, volume)
        self.assertEqual([], self.dm.calls)


class LifecycleTestCase(DriverTestBase):

    def test_delete_removes_handle_before_lv(self):
        self._make_handle()
        order = []
        self.dm.remove = mock.Mock(side_effect=lambda n, **k: order.append(
            ('remove', n)))
        self.vg.delete.side_effect = lambda n: order.append(('lvremove', n))
        self.drv.delete_volume(self.volume)
        self.assertEqual([('remove', HANDLE), ('lvremove', LV)], order)

    def test_delete_with_snapshot_is_busy_and_keeps_handle(self):
        self._make_handle()
        self.vg.lv_has_snapshot.return_value = True
        self.assertRaises(exception.VolumeIsBusy, self.drv.delete_volume,
                          self.volume)
        self.assertIn(HANDLE, self.dm.devices)
        self.vg.delete.assert_not_called()

    def test_delete_of_a_volume_living_elsewhere_is_refused(self):
        # Review 9: no move recorded, an LV here named like the volume
        # (kept by a rollback), a record naming another node: a delete
        # routed here by an older read removes nothing (before: the LV
        # went, and Cinder destroyed the record of the volume, whose
        # copy on node-b lived on).
        self.records[self.volume.id] = 'node-b@dmclone#dmclone'
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.drv.delete_volume, self.volume)
        self.assertIn('node-b', str(exc))
        self.vg.delete.assert_not_called()
        self.assertIn(LV, self.lvs)

    def test_delete_after_a_rescheduled_create_removes_the_lv(self):
        # Cinder's create flow, rescheduling a create that failed here,
        # clears the record's host (the scheduler may already have set
        # the next one) and then deletes what the driver made here: the
        # record, still "creating", no longer names this node.
        self.mock_object(objects.Volume, 'get_by_id',
                         return_value=fake_volume.fake_volume_obj(
                             self.ctxt, id=self.volume.id, host=None,
                             status='creating'))
        self.drv.delete_volume(self.volume)
        self.vg.delete.assert_called_once_with(LV)

    def test_delete_missing_lv_still_removes_handle(self):
        self._make_handle()
        self.lvs.clear()
        self.drv.delete_volume(self.volume)
        self.assertNotIn(HANDLE, self.dm.devices)
        self.vg.delete.assert_not_called()

    def unlisted(self):
        """LVM cannot list the group (a PV scanned late after a reboot).

        Brick's lookup then answers "no such LV", as it does for a group
        not found; LVM's own listing raises.
        """
        self.vg.get_volume.side_effect = lambda name: None
        self.vg_lv_names.side_effect = processutils.ProcessExecutionError(
            stderr='Volume group "%s" not found' % VG)

    def test_delete_on_an_unlisted_group_fails_keeping_the_lv(self):
        # Before: brick's lookup read the group not found as "no such
        # LV", the delete returned, Cinder destroyed the record, and the
        # tenant's LV stayed, never wiped, described by nothing.
        self._make_handle()
        self.unlisted()
        exc = self.assertRaises(dmc_exception.LVMUnlisted,
                                self.drv.delete_volume, self.volume)
        self.assertIn(VG, str(exc))
        self.assertIn(HANDLE, self.dm.devices)
        self.vg.delete.assert_not_called()

    def test_delete_snapshot_on_an_unlisted_group_fails(self):
        snapshot = fake_snapshot.fake_snapshot_obj(self.ctxt)
        self.unlisted()
        self.assertRaises(dmc_exception.LVMUnlisted,
                          self.drv.delete_snapshot, snapshot)
        self.vg.delete.assert_not_called()

    def test_delete_snapshot_missing_is_done(self):
        # (Control: a snapshot LVM lists no LV of is gone already.)
        snapshot = fake_snapshot.fake_snapshot_obj(self.ctxt)
        self.drv.delete_snapshot(snapshot)
        self.vg.delete.assert_not_called()

    @mock.patch.object(volume_utils, 'clear_volume')
    @mock.patch('os.path.exists', return_value=True)
    def test_delete_clears_lv_when_configured(self, mock_exists, mock_clear):
        self.drv.configuration.volume_clear = 'zero'
        self._make_handle()
        self.drv.delete_volume(self.volume)
        self.assertIn('/dev/mapper/dmc--vg-volume--',
                      mock_clear.call_args.args[1])

    def test_extend_online_reloads_handle(self):
        self._make_handle(sectors=2097152)
        self.dm.sizes[LV_PATH] = 4194304
        self.drv.extend_volume(self.volume, 2)
        self.vg.extend_volume.assert_called_once_with(LV, '2g')
        self.assertEqual(4194304,
                         dmsetup.table_length(self.dm.devices[HANDLE]))
        ops = [c[0] for c in self.dm.calls]
        self.assertEqual(['load', 'resume'],
                         [o for o in ops if o in ('load', 'suspend',
                                                  'resume')])

    def test_extend_without_handle(self):
        self.drv.extend_volume(self.volume, 2)
        self.vg.extend_volume.assert_called_once_with(LV, '2g')
        self.assertEqual({}, self.dm.devices)

    def test_extend_target_failure(self):
        self.mock_object(self.drv.target_driver, 'extend_target',
                         side_effect=Exception('x'))
        self.assertRaises(exception.TargetUpdateFailed,
                          self.drv.extend_volume, self.volume, 2)

    def test_create_snapshot_is_lvm_snapshot(self):
        snap = self._snapshot()
        self.drv.create_snapshot(snap)
        # LVM reserves names starting with "snapshot": Cinder escapes them.
        self.vg.create_lv_snapshot.assert_called_once_with(
            '_' + snap.name, LV, 'default')

    def test_snapshot_or_clone_of_a_volume_living_elsewhere_is_refused(self):
        # Review 9 (R9-2): a rollback whose clone lost its metadata LV
        # (on a zram metadata VG, any reboot) keeps the LV here, named
        # like the volume, and points the record at the source.  A
        # snapshot, or a clone (scheduled to the source's backend by a
        # read made while the record still named this node), that
        # reaches this node then must not read that LV: before, the new
        # volume was made from the kept copy, regions it never hydrated
        # included, and came up "available".
        self.records[self.volume.id] = 'node-b@dmclone#dmclone'
        clone = fake_volume.fake_volume_obj(self.ctxt, size=1,
                                            id=fake.VOLUME2_ID)
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.drv.create_snapshot, self._snapshot())
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.drv.create_cloned_volume, clone, self.volume)
        self.vg.create_lv_snapshot.assert_not_called()
        self.vg.create_volume.assert_not_called()

    @mock.patch.object(volume_utils, 'copy_volume')
    def test_create_from_snapshot_thick(self, mock_copy):
        snap = self._snapshot()
        self.drv.create_volume_from_snapshot(self.volume, snap)
        self.assertIn(HANDLE, self.dm.devices)
        mock_copy.assert_called_once()

    def test_create_from_snapshot_thin_bigger(self):
        self.drv.configuration.lvm_type = 'thin'
        snap = self._snapshot()
        volume = fake_volume.fake_volume_obj(self.ctxt, size=2)
        self.drv.create_volume_from_snapshot(volume, snap)
        self.vg.extend_volume.assert_called_once_with(LV, '2g')
        self.assertIn(HANDLE, self.dm.devices)

    @mock.patch.object(volume_utils, 'copy_volume')
    def test_create_cloned_volume(self, mock_copy):
        src = fake_volume.fake_volume_obj(self.ctxt, size=1,
                                          id=fake.VOLUME2_ID)
        self.records[src.id] = 'node-a@dmclone#dmclone'
        self.drv.create_cloned_volume(self.volume, src)
        self.assertIn(HANDLE, self.dm.devices)
        mock_copy.assert_called_once()

    def test_create_cloned_volume_thin(self):
        self.drv.configuration.lvm_type = 'thin'
        src = fake_volume.fake_volume_obj(self.ctxt, size=1,
                                          id=fake.VOLUME2_ID)
        self.records[src.id] = 'node-a@dmclone#dmclone'
        self.drv.create_cloned_volume(self.volume, src)
        self.vg.create_lv_snapshot.assert_called_once_with(
            LV, src.name, 'thin')
        self.assertIn(HANDLE, self.dm.devices)

    def test_create_from_snapshot_handle_failure_rolls_back(self):
        self.drv.configuration.lvm_type = 'thin'
        self.dm.fail_on['create'] = dmc_exception.DMSetupCommandFailed(
            command='create', reason='x')
        snap = self._snapshot()
        self.assertRaises(dmc_exception.DMSetupCommandFailed,
                          self.drv.create_volume_from_snapshot,
                          self.volume, snap)
        self.vg.delete.assert_called_once_with(LV)

    def test_revert_thick_recreates_handle(self):
        self._make_handle()
        snap = self._snapshot()
        order = []
        self.vg.revert.side_effect = lambda n: order.append(
            ('revert', HANDLE in self.dm.devices))
        self.drv.revert_to_snapshot(self.ctxt, self.volume, snap)
        self.assertEqual([('revert', False)], order)
        self.assertIn(HANDLE, self.dm.devices)

    def test_revert_failure_still_recreates_handle(self):
        self._make_handle()
        snap = self._snapshot()
        self.vg.revert.side_effect = exception.VolumeBackendAPIException(
            data='merge failed')
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.drv.revert_to_snapshot, self.ctxt,
                          self.volume, snap)
        self.assertIn(HANDLE, self.dm.devices)

    def _record_thin_revert(self, snap):
        """Run a thin revert; return the LVM calls it made, in order.

        Each with whether the handle existed then.
        """
        self.drv.configuration.lvm_type = 'thin'
        order = []

        def record(name):
            return lambda *args, **kwargs: order.append(
                (name, args, HANDLE in self.dm.devices))
        self.vg.revert.side_effect = record('revert')
        self.vg.deactivate_lv.side_effect = record('deactivate_lv')
        self.vg.activate_lv.side_effect = record('activate_lv')
        self.vg.create_lv_snapshot.side_effect = record('create_lv_snapshot')
        self.drv.revert_to_snapshot(self.ctxt, self.volume, snap)
        return order

    def test_revert_thin_merges_the_snapshot(self):
        self._make_handle()
        snap = self._snapshot()
        snap_lv = '_' + snap.name
        order = self._record_thin_revert(snap)
        self.assertEqual(
            [('revert', (snap_lv,), False),
             ('deactivate_lv', (LV,), False),
             ('activate_lv', (LV,), False),
             ('create_lv_snapshot', (snap_lv, LV, 'thin'), False)],
            order[:4])
        self.assertIn(HANDLE, self.dm.devices)

    def test_revert_thin_uses_the_lv_of_a_migrated_volume(self):
        # After a migration the LV is named by _name_id, not by id.
        self.volume._name_id = fake.VOLUME2_ID
        snap = self._snapshot()
        lv = 'volume-%s' % fake.VOLUME2_ID
        self.lvs[lv] = '1.00'
        self.dm.sizes['/dev/%s/%s' % (VG, lv)] = 2097152
        order = self._record_thin_revert(snap)
        self.assertEqual(('deactivate_lv', (lv,), False), order[1])
        self.assertEqual(('create_lv_snapshot', ('_' + snap.name, lv, 'thin'),
                          False), order[3])

    def test_revert_thin_never_falls_back_to_cinders_sparse_copy(self):
        # Cinder's generic revert dd-copies a volume made from the
        # snapshot onto the volume with conv=sparse (a thin pool reports
        # sparse_copy_volume): the blocks that read zero at the snapshot
        # are skipped and what was written there since survives.  The
        # manager uses it only when the driver raises NotImplementedError.
        self.drv.configuration.lvm_type = 'thin'
        mgr = mock.Mock(driver=self.drv)
        volume_manager.VolumeManager._revert_to_snapshot(
            mgr, self.ctxt, self.volume, self._snapshot())
        mgr._revert_to_snapshot_generic.assert_not_called()
        self.vg.revert.assert_called_once()

    def test_revert_thin_merge_left_pending_fails_clearly(self):
        # LVM defers the merge while the snapshot or the volume is open:
        # the volume still reads as before, the snapshot is not made
        # again over the pending one.
        self._make_handle()
        snap = self._snapshot()
        snap_lv = '_' + snap.name
        self.lvs[snap_lv] = '1.00'
        self.vg.get_volumes.side_effect = lambda name=None: (
            [{'vg': VG, 'name': snap_lv, 'size': '1.00'}]
            if name == snap_lv else [])
        self.drv.configuration.lvm_type = 'thin'
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.drv.revert_to_snapshot, self.ctxt,
                                self.volume, snap)
        self.assertIn('pending', str(exc))
        self.vg.create_lv_snapshot.assert_not_called()
        self.assertIn(HANDLE, self.dm.devices)

    def test_revert_thin_merge_left_pending_is_told_by_its_hidden_lv(self):
        # On the real kernel (run 20261126-172711-23405): a thin snapshot
        # whose merge LVM deferred is hidden, and lvs of it by name
        # reports "[_snapshot-...]": brick's get_volume, which compares
        # the bare name, no longer finds it.  Taken for a merge done, the
        # snapshot would be made again over the pending one (which fails)
        # and the error would say the volume was reverted: it was not.
        self._make_handle()
        snap = self._snapshot()
        snap_lv = '_' + snap.name
        self.vg.get_volumes.side_effect = lambda name=None: (
            [{'vg': VG, 'name': '[%s]' % snap_lv, 'size': '1.00'}]
            if name == snap_lv else [])
        self.drv.configuration.lvm_type = 'thin'
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.drv.revert_to_snapshot, self.ctxt,
                                self.volume, snap)
        self.assertIn('pending', str(exc))
        self.vg.create_lv_snapshot.assert_not_called()
        self.assertIn(HANDLE, self.dm.devices)

    def test_revert_thin_merge_failure_recreates_handle(self):
        self._make_handle()
        self.drv.configuration.lvm_type = 'thin'
        self.vg.revert.side_effect = processutils.ProcessExecutionError(
            cmd='lvconvert --merge', stderr='boom')
        self.assertRaises(processutils.ProcessExecutionError,
                          self.drv.revert_to_snapshot, self.ctxt,
                          self.volume, self._snapshot())
        self.vg.create_lv_snapshot.assert_not_called()
        self.assertIn(HANDLE, self.dm.devices)

    def test_revert_failure_not_hidden_by_a_handle_failure(self):
        self._make_handle()
        self.drv.configuration.lvm_type = 'thin'
        self.vg.revert.side_effect = processutils.ProcessExecutionError(
            cmd='lvconvert --merge', stderr='boom')
        self.dm.fail_on['create'] = dmc_exception.DMSetupCommandFailed(
            command='create', reason='x')
        self.assertRaises(processutils.ProcessExecutionError,
                          self.drv.revert_to_snapshot, self.ctxt,
                          self.volume, self._snapshot())

    def test_revert_thin_snapshot_not_made_again_fails_clearly(self):
        self._make_handle()
        self.drv.configuration.lvm_type = 'thin'
        self.vg.create_lv_snapshot.side_effect = (
            processutils.ProcessExecutionError(cmd='lvcreate', stderr='x'))
        snap = self._snapshot()
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.drv.revert_to_snapshot, self.ctxt,
                                self.volume, snap)
        self.assertIn('reverted', str(exc))
        self.assertIn(snap.id, str(exc))
        self.assertIn(HANDLE, self.dm.devices)

    @mock.patch('cinder.image.image_utils.fetch_to_raw')
    def test_copy_image_to_volume_through_handle(self, mock_fetch):
        self.drv.copy_image_to_volume(self.ctxt, self.volume, 'svc', 'img')
        self.assertEqual(HANDLE_PATH, mock_fetch.call_args.args[3])
        self.assertEqual(1, mock_fetch.call_args.kwargs['size'])

    @mock.patch.object(volume_utils, 'upload_volume')
    def test_copy_volume_to_image_through_handle(self, mock_upload):
        self.drv.copy_volume_to_image(self.ctxt, self.volume, 'svc', {})
        self.assertEqual(HANDLE_PATH, mock_upload.call_args.args[3])

    def test_migrate_to_another_backend_is_generic(self):
        self.assertEqual((False, None), self.drv.migrate_volume(
            self.ctxt, self.volume, {'host': 'other@lvm#lvm',
                                     'capabilities': {}}))

    def test_retype_within_backend(self):
        self.assertTrue(self.drv.retype(self.ctxt, self.volume, {}, {},
                                        'node-a@dmclone'))

    def test_update_migrated_volume_renames_handle(self):
        new = fake_volume.fake_volume_obj(self.ctxt, size=1,
                                          id=fake.VOLUME2_ID)
        self.dm.devices['dmclone-dmc--vg-' + new.name] = [
            dmsetup.linear_segment(0, 8, '/dev/%s/%s' % (VG, new.name))]
        update = self.drv.update_migrated_volume(self.ctxt, self.volume,
                                                 new, 'available')
        self.assertEqual({'_name_id': None, 'provider_location': None},
                         update)
        self.vg.rename_volume.assert_called_once_with(new.name, LV)
        self.assertEqual({HANDLE}, set(self.dm.devices))

    def test_update_migrated_volume_in_use_keeps_handle(self):
        new = fake_volume.fake_volume_obj(self.ctxt, size=1,
                                          id=fake.VOLUME2_ID)
        handle = 'dmclone-dmc--vg-' + new.name
        self.dm.devices[handle] = [dmsetup.linear_segment(0, 8, '/dev/x')]
        update = self.drv.update_migrated_volume(self.ctxt, self.volume,
                                                 new, 'in-use')
        self.assertEqual(fake.VOLUME2_ID, update['_name_id'])
        self.assertEqual({handle}, set(self.dm.devices))

    def test_update_migrated_volume_before_the_records_are_swapped(self):
        # Cinder's generic migration (retype from another backend,
        # ``--force-host-copy``, a node without dmclone_initiator)
        # calls update_migrated_volume on the new volume's node BEFORE
        # finish_volume_migration swaps the records: the original
        # volume's record still names its old host.  The LV was just
        # renamed to the original's name; mapping its handle is refused,
        # the RPC fails, Cinder deletes the temporary volume (whose LV is
        # gone: renamed) and a full copy of the data stays behind under
        # the original volume's name on this node.
        self.records[self.volume.id] = 'other@lvm#lvm'
        new = fake_volume.fake_volume_obj(self.ctxt, size=1,
                                          id=fake.VOLUME2_ID)
        self.dm.devices['dmclone-dmc--vg-' + new.name] = [
            dmsetup.linear_segment(0, 8, '/dev/%s/%s' % (VG, new.name))]
        update = self.drv.update_migrated_volume(self.ctxt, self.volume,
                                                 new, 'available')
        self.assertEqual({'_name_id': None, 'provider_location': None},
                         update)
        self.assertEqual({HANDLE}, set(self.dm.devices))


@ddt.ddt
class ManageTestCase(DriverTestBase):

    def _volume_record(self, ctxt, volume_id):
        """The test database's volume; else the one being managed here.

        (Whether an LV is some volume's is read from the database.)
        """
        try:
            return self.get_by_id(ctxt, volume_id)
        except exception.VolumeNotFound:
            if volume_id not in self.managed:
                raise
        return super()._volume_record(ctxt, volume_id)

    def setUp(self):
        self.get_by_id = objects.Volume.get_by_id
        super().setUp()
        #: the ids of the volumes being managed (their records name
        #: node-a; not in the test database).
        self.managed = {self.volume.id}

    @mock.patch.object(volume_utils, 'check_already_managed_volume',
                       return_value=False)
    def test_manage_existing(self, mock_check):
        self.drv.manage_existing(self.volume, {'source-name': 'legacy'})
        self.vg.rename_volume.assert_called_once_with('legacy', LV)
        self.assertIn(HANDLE, self.dm.devices)

    @ddt.data({}, {'source-name': '../etc'}, {'source-name': 'a b'},
              {'source-name': None}, 'legacy')
    def test_manage_bad_reference(self, ref):
        self.assertRaises(exception.ManageExistingInvalidReference,
                          self.drv.manage_existing, self.volume, ref)
        self.assertRaises(exception.ManageExistingInvalidReference,
                          self.drv.manage_existing_get_size, self.volume,
                          ref)
        self.vg.rename_volume.assert_not_called()

    def test_manage_refuses_metadata_lv(self):
        ref = {'source-name': 'volume-x-dmcmeta'}
        exc = self.assertRaises(exception.ManageExistingInvalidReference,
                                self.drv.manage_existing, self.volume, ref)
        self.assertIn('dm-clone metadata', str(exc))

    def test_manage_refuses_an_old_copy_being_wiped(self):
        ref = {'source-name': LV + '-dmcwipe-0123abcd'}
        exc = self.assertRaises(exception.ManageExistingInvalidReference,
                                self.drv.manage_existing, self.volume, ref)
        self.assertIn('old copy being wiped', str(exc))

    def test_manage_get_size(self):
        self.lvs['legacy'] = '1.5'
        self.assertEqual(2, self.drv.manage_existing_get_size(
            self.volume, {'source-name': 'legacy'}))

    def test_unmanage_keeps_lv(self):
        self._make_handle()
        self.drv.unmanage(self.volume)
        self.assertNotIn(HANDLE, self.dm.devices)
        self.vg.delete.assert_not_called()

    def test_manageable_volumes_hide_metadata(self):
        self.vg.get_volumes.return_value = [
            {'name': 'legacy', 'size': '1.0'},
            {'name': LV + '-dmcmeta', 'size': '0.01'},
            {'name': LV + '-dmcwipe-0123abcd', 'size': '1.0'}]
        self.vg.lv_is_snapshot.return_value = False
        self.vg.lv_is_open.return_value = False
        entries = self.drv.get_manageable_volumes([], None, 10, 0,
                                                  ['size'], ['asc'])
        by_name = {e['reference']['source-name']: e for e in entries}
        self.assertTrue(by_name['legacy']['safe_to_manage'])
        self.assertFalse(by_name[LV + '-dmcmeta']['safe_to_manage'])
        self.assertEqual('dm-clone transfer metadata',
                         by_name[LV + '-dmcmeta']['reason_not_safe'])
        self.assertEqual('old copy being wiped',
                         by_name[LV + '-dmcwipe-0123abcd']['reason_not_safe'])

    def test_an_lv_named_like_another_nodes_volume_is_not_safe(self):
        # A copy kept after a move's rollback (or an abandon as lost) is
        # named like its volume, which lives on another node: never
        # offered as safe to manage (before: it was).
        kept = 'volume-%s' % fake.VOLUME2_ID
        self.vg.get_volumes.return_value = [{'name': kept, 'size': '1.0'}]
        self.vg.lv_is_snapshot.return_value = False
        self.vg.lv_is_open.return_value = False
        entries = self.drv.get_manageable_volumes([], None, 10, 0,
                                                  ['size'], ['asc'])
        self.assertFalse(entries[0]['safe_to_manage'])

    # -- a volume whose LV is named after its _name_id ---------------------

    def _listed(self, cinder_volumes, *lvs, open_lvs=()):
        self.vg.get_volumes.return_value = [{'name': lv, 'size': '1.0'}
                                            for lv in lvs]
        self.vg.lv_is_snapshot.return_value = False
        self.vg.lv_is_open.side_effect = lambda name: name in open_lvs
        entries = self.drv.get_manageable_volumes(cinder_volumes, None, 10,
                                                  0, ['size'], ['asc'])
        return {e['reference']['source-name']: e for e in entries}

    def test_the_lv_of_a_name_id_volume_is_listed_as_managed(self):
        # After a generic migration of an in-use volume its LV keeps the
        # temporary volume's name, whose id Cinder's listing takes for
        # the volume's: it saw no volume of that id (before: "volume in
        # use" with no volume named, or, without the handle, "named like
        # another volume: maybe an old copy").
        migrated = fake_volume.fake_volume_obj(
            self.ctxt, id=fake.VOLUME2_ID, _name_id=fake.VOLUME_ID)
        for open_lvs in ((LV,), ()):
            entry = self._listed([migrated], LV, open_lvs=open_lvs)[LV]
            self.assertEqual((False, 'already managed', fake.VOLUME2_ID),
                             (entry['safe_to_manage'],
                              entry['reason_not_safe'], entry['cinder_id']))

    def test_an_lv_named_after_a_name_id_volumes_id_is_not_its(self):
        # Cinder's listing calls volume-<id> "already managed" by that
        # volume, whose LV has another name (its _name_id).
        migrated = fake_volume.fake_volume_obj(
            self.ctxt, id=fake.VOLUME2_ID, _name_id=fake.VOLUME_ID)
        stale = 'volume-%s' % fake.VOLUME2_ID
        entry = self._listed([migrated], stale)[stale]
        self.assertFalse(entry['safe_to_manage'])
        self.assertIsNone(entry['cinder_id'])
        self.assertIn('named like another volume', entry['reason_not_safe'])

    def test_manage_refuses_the_lv_of_a_name_id_volume(self):
        # Cinder checks only that no volume has the id in the LV's name:
        # the LV of a volume with a _name_id would be renamed to the new
        # volume's, and the volume left without its data.
        tests_utils.create_volume(self.ctxt, id=fake.VOLUME2_ID,
                                  _name_id=fake.VOLUME_ID,
                                  host='node-b@dmclone#dmclone')
        ref = {'source-name': LV}
        for call in (self.drv.manage_existing_get_size,
                     self.drv.manage_existing):
            self.assertRaises(exception.ManageExistingAlreadyManaged,
                              call, self.volume, ref)
        self.vg.rename_volume.assert_not_called()

    @mock.patch.object(volume_utils, 'check_already_managed_volume',
                       return_value=False)
    def test_manage_an_lv_named_after_a_deleted_volume(self, mock_check):
        gone = tests_utils.create_volume(self.ctxt, id=fake.VOLUME2_ID,
                                         _name_id=fake.VOLUME_ID)
        gone.destroy()
        self.managed = {fake.VOLUME3_ID}
        volume = fake_volume.fake_volume_obj(self.ctxt, id=fake.VOLUME3_ID)
        self.drv.manage_existing(volume, {'source-name': LV})
        self.vg.rename_volume.assert_called_once_with(LV, volume.name)


class StatsTestCase(DriverTestBase):

    def test_pool_capabilities(self):
        self.vg.vg_size = 10.0
        self.vg.vg_free_space = 8.0
        self.vg.get_volumes.return_value = []
        stats = self.drv.get_volume_stats(refresh=True)
        self.assertEqual('dmclone', stats['volume_backend_name'])
        self.assertEqual(driver.DMCloneVolumeDriver.VERSION,
                         stats['driver_version'])
        pool = stats['pools'][0]
        self.assertTrue(pool['online_extend_support'])
        self.assertTrue(pool['multiattach'])
        self.assertTrue(pool['thick_provisioning_support'])
        self.assertFalse(pool['thin_provisioning_support'])
        self.assertEqual(8.0, pool['free_capacity_gb'])
        self.assertEqual('node-a', pool['dmclone_node'])
        self.assertEqual('DMCloneVolumeDriver:node-a:dmc-vg:default:0',
                         pool['location_info'])

    def thin(self, report=None, **overrides):
        """The backend runs thin; LVM's report of its pool (see test_thin)."""
        self.drv = self._make_driver(lvm_type='thin', **overrides)
        self.drv.dm = self.dm
        self.vg.vg_thin_pool_size = 100.0
        self.vg.vg_thin_pool_free_space = 60.0
        self.vg.vg_provisioned_capacity = 80.01
        self.vg.get_volumes.return_value = []
        self.thin_lvs = self.mock_object(
            privileged, 'thin_lvs', return_value=thin.parse_lvs(
                report or THIN_REPORT))

    def test_thin_pool(self):
        # Cinder's thin figures, with what will really be written: the
        # regions the clones moving here have not hydrated yet (0.5 GiB)
        # come off the free space, and the pool's own thin LVs make its
        # provisioned capacity (not the thick metadata LVs of clones).
        self.thin(reserved_percentage=5, max_over_subscription_ratio='auto')
        self._clone_handle('dmclone-dmc--vg-volume-b', '/dev/dmc-vg/b',
                           hydrated=8192)
        pool = self.drv.get_volume_stats(refresh=True)['pools'][0]
        self.thin_lvs.assert_called_once_with(VG, execute=self.drv._execute,
                                              root_helper=mock.ANY)
        self.assertTrue(pool['thin_provisioning_support'])
        self.assertFalse(pool['thick_provisioning_support'])
        self.assertEqual(100.0, pool['total_capacity_gb'])
        self.assertEqual(59.5, pool['free_capacity_gb'])
        self.assertEqual(80.0, pool['provisioned_capacity_gb'])
        self.assertEqual(0.5, pool['dmclone_hydration_pending_gb'])
        self.assertEqual('auto', pool['max_over_subscription_ratio'])
        self.assertEqual(5, pool['reserved_percentage'])

    def test_thin_pool_counts_a_clone_not_rebuilt_yet(self):
        # Review 7, R7-4: volume-1 moves here (its metadata LV beside it)
        # but its clone is not loaded (a reboot; its source is down):
        # its 50 GiB thin LV holds 25 %, it still writes 37.5 GiB.
        self.thin()
        self.vg.get_volumes.return_value = [
            {'name': 'volume-1-dmcmeta', 'size': '0.01'}]
        pool = self.drv.get_volume_stats(refresh=True)['pools'][0]
        self.assertEqual(37.5, pool['dmclone_hydration_pending_gb'])
        self.assertEqual(22.5, pool['free_capacity_gb'])

    def mapped_clone_of_volume_1(self):
        """volume-1 moves here with a region map: 1024 regions left.

        Its metadata LV is beside it, its clone loaded (16384 regions of
        64 KiB, the others discarded or copied): it still copies 64 MiB;
        LVM says its 50 GiB LV, 25 % allocated, lacks 37.5 GiB.
        """
        self.vg.get_volumes.return_value = [
            {'name': 'volume-1-dmcmeta', 'size': '0.01'}]
        self._clone_handle('dmclone-dmc--vg-volume-1', '/dev/dmc-vg/volume-1',
                           hydrated=16384 - 1024)

    def test_thin_pool_counts_what_mapped_clones_still_copy(self):
        # Issue 19, item 1: with dmclone_thin_map, a loaded clone counts
        # what it still copies; the scheduler sees the pool's real room.
        self.thin(dmclone_thin_map=True)
        self.mapped_clone_of_volume_1()
        pool = self.drv.get_volume_stats(refresh=True)['pools'][0]
        self.assertEqual(0.06, pool['dmclone_hydration_pending_gb'])
        self.assertEqual(59.94, pool['free_capacity_gb'])

    def test_thin_pool_with_the_map_off_counts_as_before(self):
        self.thin()
        self.mapped_clone_of_volume_1()
        pool = self.drv.get_volume_stats(refresh=True)['pools'][0]
        self.assertEqual(37.5, pool['dmclone_hydration_pending_gb'])
        self.assertEqual(22.5, pool['free_capacity_gb'])

    def test_thin_pool_counts_a_clone_not_rebuilt_yet_with_the_map_on(self):
        self.thin(dmclone_thin_map=True)
        self.vg.get_volumes.return_value = [
            {'name': 'volume-1-dmcmeta', 'size': '0.01'}]
        pool = self.drv.get_volume_stats(refresh=True)['pools'][0]
        self.assertEqual(37.5, pool['dmclone_hydration_pending_gb'])
        self.assertEqual(22.5, pool['free_capacity_gb'])

    def test_thin_pool_metadata_bounds_the_free_space(self):
        # 100 MiB of metadata, 99.9 % used: 100 KiB map 133 MiB of data.
        self.thin(THIN_REPORT.replace('|10.00|', '|99.90|'))
        pool = self.drv.get_volume_stats(refresh=True)['pools'][0]
        self.assertEqual(0.13, pool['free_capacity_gb'])

    def test_unreadable_thin_pool_keeps_cinders_figures(self):
        self.thin()
        self.thin_lvs.side_effect = dmc_exception.PrivilegedCommandFailed(
            command='lvs', reason='boom')
        with self.assertLogs(driver.LOG.logger, 'WARNING') as logs:
            pool = self.drv.get_volume_stats(refresh=True)['pools'][0]
        self.assertIn('thin pool', '\n'.join(logs.output))
        self.assertEqual(60.0, pool['free_capacity_gb'])
        self.assertEqual(80.01, pool['provisioned_capacity_gb'])
        self.assertNotIn('dmclone_hydration_pending_gb', pool)
        self.assertEqual('node-a', pool['dmclone_node'])

    def test_thick_backend_reads_no_thin_pool(self):
        thin_lvs = self.mock_object(privileged, 'thin_lvs')
        self.vg.vg_size = 10.0
        self.vg.vg_free_space = 8.0
        self.drv.get_volume_stats(refresh=True)
        thin_lvs.assert_not_called()

    def test_pool_publishes_the_initiator(self):
        # A migration to this node is a move: the source needs the
        # initiator its export admits, and no attach brings a connector.
        self.vg.vg_size = 10.0
        self.vg.vg_free_space = 8.0
        self.vg.get_volumes.return_value = []
        props = self.mock_object(
            volume_utils, 'brick_get_connector_properties',
            return_value={'initiator': 'iqn.2024-01.org.example.a:i'})
        pool = self.drv.get_volume_stats(refresh=True)['pools'][0]
        self.assertEqual('iqn.2024-01.org.example.a:i',
                         pool['dmclone_initiator'])
        self.drv.get_volume_stats(refresh=True)
        props.assert_called_once_with()

    def test_unreadable_initiator_keeps_the_stats(self):
        self.vg.vg_size = 10.0
        self.vg.vg_free_space = 8.0
        self.vg.get_volumes.return_value = []
        self.mock_object(volume_utils, 'brick_get_connector_properties',
                         side_effect=OSError('no initiatorname.iscsi'))
        pool = self.drv.get_volume_stats(refresh=True)['pools'][0]
        self.assertIsNone(pool['dmclone_initiator'])
        self.assertEqual('node-a', pool['dmclone_node'])

    def test_no_vg_no_stats(self):
        self.drv.vg = None
        self.assertEqual({}, self.drv.get_volume_stats(refresh=True))

    def _clone_handle(self, name, lv_path, hydrated=None):
        """A clone of 1 GiB (16384 regions) with ``hydrated`` regions."""
        meta = '/dev/%s/%s-dmcmeta' % (VG, name)
        self.dm.devices[name] = [dmsetup.clone_segment(
            0, 2097152, meta, lv_path,
            '/dev/disk/by-path/ip-10.0.0.2:3260-lun-0', 128)]
        if hydrated is not None:
            self.dm.meta_hydrated[meta] = hydrated

    def test_transfers_in_flight_counts_own_clones(self):
        self.vg.vg_size = 10.0
        self.vg.vg_free_space = 8.0
        self.vg.get_volumes.return_value = []
        pool = self.drv.get_volume_stats(refresh=True)['pools'][0]
        self.assertEqual(0, pool['dmclone_transfers_in_flight'])
        self._make_handle()
        self._clone_handle('dmclone-dmc--vg-volume-b', '/dev/dmc-vg/b')
        self._clone_handle('dmclone-dmc--vg-volume-c', '/dev/dmc-vg/c')
        # Another backend's clone on the same host is not this pool's.
        self._clone_handle('dmclone-other-volume-d', '/dev/other/d')
        pool = self.drv.get_volume_stats(refresh=True)['pools'][0]
        self.assertEqual(2, pool['dmclone_transfers_in_flight'])

    def test_transfer_progress_in_pool_stats(self):
        self.vg.vg_size = 10.0
        self.vg.vg_free_space = 8.0
        self.vg.get_volumes.return_value = []
        report = {'vol': {'percent': '42.0', 'state': 'hydrating'}}
        self.drv._moves = mock.Mock()
        self.drv._moves.tracker.progress_report.return_value = report
        pool = self.drv.get_volume_stats(refresh=True)['pools'][0]
        self.assertEqual(report, pool['dmclone_transfers'])

    def test_transfer_progress_failure_keeps_the_stats(self):
        self.vg.vg_size = 10.0
        self.vg.vg_free_space = 8.0
        self.vg.get_volumes.return_value = []
        self.drv._moves = mock.Mock()
        self.drv._moves.tracker.progress_report.side_effect = RuntimeError(
            'db')
        pool = self.drv.get_volume_stats(refresh=True)['pools'][0]
        self.drv._moves.tracker.progress_report.assert_called_once_with()
        self.assertEqual({}, pool['dmclone_transfers'])
        self.assertEqual('node-a', pool['dmclone_node'])

    def test_transfers_in_flight_unknown_when_dmsetup_fails(self):
        self.vg.vg_size = 10.0
        self.vg.vg_free_space = 8.0
        self.vg.get_volumes.return_value = []
        self.dm.clone_statuses = mock.Mock(
            side_effect=dmc_exception.DMSetupCommandFailed(
                command='dmsetup status', reason='boom'))
        pool = self.drv.get_volume_stats(refresh=True)['pools'][0]
        self.assertIsNone(pool['dmclone_transfers_in_flight'])
        self.assertEqual('node-a', pool['dmclone_node'])


@ddt.ddt
class ConnectionTestCase(DriverTestBase):

    def test_local_connection(self):
        info = self.drv.initialize_connection(self.volume, LOCAL)
        self.assertEqual('local', info['driver_volume_type'])
        self.assertEqual(HANDLE_PATH, info['data']['device_path'])
        self.assertIn(HANDLE, self.dm.devices)

    def test_local_export_creates_no_target(self):
        target = self.mock_object(self.drv.target_driver, 'create_export')
        self.assertEqual({}, self.drv.create_export(self.ctxt, self.volume,
                                                    LOCAL))
        target.assert_not_called()
        self.assertIn(HANDLE, self.dm.devices)

    def test_requests_serving_a_volume_living_elsewhere_are_refused(self):
        # (R7-2's check, at the call sites: R8-4.)  No move recorded, no
        # handle, a record naming another node (an LV kept by a
        # rollback): the requests that would serve the LV as the volume
        # are refused and map nothing.
        self.records[self.volume.id] = 'node-b@dmclone#dmclone'
        image = self.mock_object(volume_utils, 'upload_volume')
        for serve in (
                lambda: self.drv.create_export(self.ctxt, self.volume,
                                               LOCAL),
                lambda: self.drv.initialize_connection(self.volume, LOCAL),
                lambda: self.drv.create_export(self.ctxt, self.volume,
                                               REMOTE),
                lambda: self.drv.copy_volume_to_image(
                    self.ctxt, self.volume, mock.Mock(), {})):
            self.assertRaises(exception.VolumeBackendAPIException, serve)
        self.assertEqual({}, self.dm.devices)
        image.assert_not_called()

    def test_remote_export_is_an_attach_in_flight_until_it_connects(self):
        # Review 9: the monitor's tick leaves an export an attach from
        # another node is connecting to (Source.export_for_attach).
        self.mock_object(self.drv.target_driver, 'create_export',
                         return_value={'location': 'loc', 'auth': 'CHAP u p'})
        self.drv.create_export(self.ctxt, self.volume, REMOTE)
        self.assertTrue(self.drv.source._attach_in_flight(self.volume.id))
        self.mock_object(self.drv.source, 'wants_move', return_value=False)
        self.mock_object(self.drv.source, 'connect_over_iscsi',
                         side_effect=exception.ISCSITargetAttachFailed(
                             volume_id=self.volume.id))
        self.assertRaises(exception.ISCSITargetAttachFailed,
                          self.drv.initialize_connection, self.volume, REMOTE)
        self.assertFalse(self.drv.source._attach_in_flight(self.volume.id))

    def test_remote_export_exports_the_handle(self):
        target = self.mock_object(
            self.drv.target_driver, 'create_export',
            return_value={'location': 'loc', 'auth': 'CHAP u p'})
        update = self.drv.create_export(self.ctxt, self.volume, REMOTE)
        self.assertEqual({'provider_location': 'loc',
                          'provider_auth': 'CHAP u p'}, update)
        self.assertEqual(HANDLE_PATH, target.call_args.args[2])

    def test_remote_connection_is_iscsi(self):
        self.volume.provider_location = '10.0.0.1:3260,1 iqn.x:%s 0' % LV
        self.volume.provider_auth = 'CHAP user pass'
        info = self.drv.initialize_connection(self.volume, REMOTE)
        self.assertEqual('iscsi', info['driver_volume_type'])
        self.assertEqual('CHAP', info['data']['auth_method'])
        self.assertEqual('user', info['data']['auth_username'])

    def test_validate_connector(self):
        self.assertTrue(self.drv.validate_connector({'host': 'node-a'}))
        self.assertRaises(exception.InvalidConnectorException,
                          self.drv.validate_connector, {'host': 'node-b'})
        self.drv.validate_connector(REMOTE)

    def _instance_attaching(self):
        attachment = objects.VolumeAttachment(
            id=fake.ATTACHMENT_ID, instance_uuid=fake.INSTANCE_ID,
            attach_status='attaching')
        self.mock_object(
            objects.VolumeAttachmentList, 'get_all_by_volume_id',
            return_value=objects.VolumeAttachmentList(objects=[attachment]))
        self.volume.volume_attachment = objects.VolumeAttachmentList(
            objects=[attachment])

    HOSTLESS = ({'initiator': 'iqn.2024-01.org.example.b:i'},
                {'host': None, 'initiator': 'iqn.2024-01.org.example.b:i'},
                {'host': '', 'initiator': 'iqn.2024-01.org.example.b:i'},
                {}, None)

    def _assert_refused_without_host(self, call):
        self._instance_attaching()
        target = self.mock_object(self.drv.target_driver, 'create_export')
        for connector in self.HOSTLESS:
            exc = self.assertRaises(exception.InvalidConnectorException,
                                    call, connector)
            self.assertIn('host', str(exc))
        target.assert_not_called()
        self.assertNotIn(HANDLE, self.dm.devices)

    def test_validate_connector_without_host(self):
        self._assert_refused_without_host(self.drv.validate_connector)

    def test_create_export_without_host(self):
        self._assert_refused_without_host(
            lambda c: self.drv.create_export(self.ctxt, self.volume, c))

    def test_initialize_connection_without_host(self):
        self._assert_refused_without_host(
            lambda c: self.drv.initialize_connection(self.volume, c))

    def test_validate_connector_of_a_node_to_node_step(self):
        # the other node's service sends its own connector with the step;
        # the step is checked where it is served, not here
        step = {'initiator': 'iqn.2024-01.org.example.b:i',
                'dmclone': {'op': 'prepare'}}
        self.drv.validate_connector(step)
        self.drv.validate_connector(dict(step, host='node-b'))

    def test_terminate_without_host_still_detaches(self):
        # a force detach has no connector; nothing here needs its host
        target = self.mock_object(self.drv.target_driver,
                                  'terminate_connection')
        connector = {'initiator': 'iqn.2024-01.org.example.b:i'}
        self.assertFalse(self.drv.terminate_connection(self.volume,
                                                       connector))
        self.assertFalse(self.drv.terminate_connection(self.volume, None,
                                                       force=True))
        self.assertEqual(2, target.call_count)

    def test_terminate_local(self):
        target = self.mock_object(self.drv.target_driver,
                                  'terminate_connection')
        self.assertFalse(self.drv.terminate_connection(self.volume, LOCAL))
        target.assert_not_called()

    def test_terminate_local_with_other_attachments(self):
        self.volume.volume_attachment = objects.VolumeAttachmentList(
            objects=[objects.VolumeAttachment(id=fake.ATTACHMENT_ID),
                     objects.VolumeAttachment(id=fake.ATTACHMENT2_ID)])
        self.assertTrue(self.drv.terminate_connection(self.volume, LOCAL))

    def test_terminate_remote(self):
        target = self.mock_object(self.drv.target_driver,
                                  'terminate_connection')
        self.assertFalse(self.drv.terminate_connection(self.volume, REMOTE))
        target.assert_called_once_with(self.volume, REMOTE)

    def test_ensure_export_rebuilds_handle(self):
        target = self.mock_object(self.drv.target_driver, 'ensure_export')
        self.assertIsNone(self.drv.ensure_export(self.ctxt, self.volume))
        self.assertIn(HANDLE, self.dm.devices)
        target.assert_not_called()

    def test_ensure_export_restores_target(self):
        self.volume.provider_location = '10.0.0.1:3260,1 iqn.x:%s 0' % LV
        target = self.mock_object(self.drv.target_driver, 'ensure_export')
        self.drv.ensure_export(self.ctxt, self.volume)
        target.assert_called_once_with(self.ctxt, self.volume, HANDLE_PATH)

    def test_ensure_export_rebuilds_every_exported_handle_first(self):
        # After a reboot LIO's helper restores every saved target at the
        # first ensure_export: each needs its volume's handle by then.
        location = '10.0.0.1:3260,1 iqn.x:%s 0'
        self.volume.provider_location = location % LV
        other = fake_volume.fake_volume_obj(self.ctxt, id=fake.VOLUME2_ID)
        other.provider_location = location % other.name
        local = fake_volume.fake_volume_obj(self.ctxt, id=fake.VOLUME3_ID)
        self.lvs.update({other.name: '1.00', local.name: '1.00'})
        by_host = self.mock_object(objects.VolumeList, 'get_all_by_host',
                                   return_value=[self.volume, other, local])
        handles = []
        self.mock_object(
            self.drv.target_driver, 'ensure_export',
            side_effect=lambda *a: handles.append(sorted(self.dm.devices)))
        self.drv.ensure_export(self.ctxt, self.volume)
        self.drv.ensure_export(self.ctxt, other)
        other_handle = 'dmclone-dmc--vg-' + other.name
        self.assertEqual([sorted([HANDLE, other_handle])] * 2, handles)
        # Once a start; a local attach's handle is its own ensure_export's.
        by_host.assert_called_once_with(self.ctxt, 'node-a@dmclone#dmclone')
        self.assertNotIn('dmclone-dmc--vg-' + local.name, self.dm.devices)

    def test_ensure_export_goes_on_past_a_handle_it_cannot_rebuild(self):
        location = '10.0.0.1:3260,1 iqn.x:%s 0'
        self.volume.provider_location = location % LV
        moving_in = fake_volume.fake_volume_obj(self.ctxt,
                                                id=fake.VOLUME2_ID)
        moving_in.provider_location = location % moving_in.name
        self.lvs.update({moving_in.name: '1.00',
                         moving_in.name + '-dmcmeta': '0.01'})
        self.mock_object(objects.VolumeList, 'get_all_by_host',
                         return_value=[moving_in, self.volume])
        target = self.mock_object(self.drv.target_driver, 'ensure_export')
        self.drv.ensure_export(self.ctxt, self.volume)
        target.assert_called_once_with(self.ctxt, self.volume, HANDLE_PATH)
        self.assertEqual([HANDLE], sorted(self.dm.devices))

    def test_ensure_export_leaves_another_nodes_export(self):
        # A volume that moved here still names its source's export until
        # the transfer is finalized: this node must not re-create it.
        self.volume.provider_location = '10.0.0.2:3260,1 iqn.x:%s 0' % LV
        target = self.mock_object(self.drv.target_driver, 'ensure_export')
        self.drv.ensure_export(self.ctxt, self.volume)
        target.assert_not_called()
        self.assertIn(HANDLE, self.dm.devices)

    def test_remove_export(self):
        self.volume.provider_location = '10.0.0.1:3260,1 iqn.x:%s 0' % LV
        target = self.mock_object(self.drv.target_driver, 'remove_export')
        self.drv.remove_export(self.ctxt, self.volume)
        target.assert_called_once_with(self.ctxt, self.volume)

    @ddt.data(
        ('10.0.0.1', '10.0.0.1:3260,1 iqn.x:lv 0', True),
        ('10.0.0.1', '10.0.0.10:3260,1 iqn.x:lv 0', False),
        ('10.0.0.1', '10.0.0.2:3260;10.0.0.1:3260,1 iqn.x:lv 0', False),
        ('10.0.0.1', '10.0.0.1:3260;10.0.0.2:3260,1 iqn.x:lv 0', True),
        ('fd00::1', '[fd00::1]:3260,1 iqn.x:lv 0', True),
        ('fd00::1', '[fd00:0:0::1]:3260,1 iqn.x:lv 0', True),
        ('FD00::1', '[fd00::1]:3260,1 iqn.x:lv 0', True),
        ('fd00::1', '[fd00::10]:3260,1 iqn.x:lv 0', False),
        ('fd00::1', '[fd00::1:5]:3260,1 iqn.x:lv 0', False),
        ('fd00::1', '[fd00::1]:3260;[fd00::2]:3260,1 iqn.x:lv 0', True),
        ('fd00::1', '10.0.0.1:3260,1 iqn.x:lv 0', False),
        ('storage-a.example', 'storage-a.example:3260,1 iqn.x:lv 0', True),
        ('storage-a.example', 'Storage-A.example:3260,1 iqn.x:lv 0', True),
        ('storage-a.example', 'storage-a.example.org:3260,1 iqn.x:lv 0',
         False),
        ('storage-a.example', 'storage-a:3260,1 iqn.x:lv 0', False),
        ('10.0.0.1', 'no portal here', False),
        ('10.0.0.1', '', False),
        ('10.0.0.1', None, False))
    @ddt.unpack
    def test_remove_export_by_portal(self, address, location, own):
        # Cinder's iSCSI targets write the primary portal first, an IPv6
        # address in brackets (volume_utils.sanitize_host)
        self.drv = self._make_driver(target_ip_address=address)
        self.drv.dm = self.dm
        self.volume.provider_location = location
        target = self.mock_object(self.drv.target_driver, 'remove_export')
        self.drv.remove_export(self.ctxt, self.volume)
        self.assertEqual(1 if own else 0, target.call_count)

    def test_ipv6_location_as_cinder_writes_it(self):
        self.drv = self._make_driver(target_ip_address='fd00::1')
        helper = self.drv.target_driver
        location = helper._iscsi_location('fd00::1', 1, 'iqn.x:lv', 0)
        self.assertTrue(self.drv._owns_export(
            {'provider_location': location}))

    def test_remove_export_of_another_node_is_left_alone(self):
        self.volume.provider_location = '10.0.0.2:3260,1 iqn.x:%s 0' % LV
        target = self.mock_object(self.drv.target_driver, 'remove_export')
        self.drv.remove_export(self.ctxt, self.volume)
        self.drv.remove_export(self.ctxt, fake_volume.fake_volume_obj(
            self.ctxt, provider_location=None))
        target.assert_not_called()


class LioDriverTestCase(test.TestCase):
    """The driver builds with Cinder's LIO target helper."""

    @mock.patch('cinder.utils.execute')
    def test_lioadm(self, mock_execute):
        configuration = make_configuration(self, target_helper='lioadm')
        drv = driver.DMCloneVolumeDriver(configuration=configuration,
                                         vg_obj=mock.Mock(), host='n@b')
        self.assertEqual('iSCSI', drv.protocol)
        mock_execute.assert_any_call('cinder-rtstool', 'verify')
