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

"""How the driver hands transfers to the Mover."""

from unittest import mock

import ddt

from cinder import exception
from cinder.message import api as message_api
from cinder.message import message_field
from cinder import objects
from cinder.objects import fields
from cinder.tests.unit import fake_constants as fake
from cinder.tests.unit import fake_volume
from cinder.volume import volume_utils

from cinder_dmclone import dmsetup
from cinder_dmclone import mover
from cinder_dmclone import transfer
from tests.unit import test_driver
from tests.unit.test_driver import HANDLE
from tests.unit.test_driver import HANDLE_PATH
from tests.unit.test_driver import LOCAL
from tests.unit.test_driver import LV
from tests.unit.test_driver import LV_PATH
from tests.unit.test_driver import REMOTE

STEP = {'op': 'prepare', 'hydrate': True, 'size_gb': 1}


def transfer_metadata(state=transfer.HYDRATING, dest='node-a',
                      source='node-b'):
    return transfer.Transfer(
        volume_id=fake.VOLUME_ID, lv_name=LV, state=state,
        source_host='%s@dmclone#dmclone' % source,
        dest_host='%s@dmclone#dmclone' % dest, source_node=source,
        dest_node=dest, region_sectors=128, clone_sectors=2097152,
        target_portal='10.0.0.2:3260',
        target_iqn='iqn.2010-10.org.openstack:%s' % LV).to_metadata()


def moving():
    """What the Mover raises for a volume in the middle of a move."""
    return transfer.TransferInProgress(
        volume_name=LV, source='node-a', dest='node-b', state='cloned',
        percent='0.0', action='this')


class MockMoverTestCase(test_driver.DriverTestBase):
    """The driver with a mock Mover: which entry point goes where."""

    def setUp(self):
        super().setUp()
        self.mover = mock.Mock(spec=mover.Mover)
        self.mover.load.return_value = None
        self.mover.delete.return_value = False
        self.mover.extend.return_value = False
        self.mover.detached.return_value = False
        self.mover.wants_move.return_value = False
        self.drv._mover = self.mover

    def test_prepare_step_returns_local_connection(self):
        self.mover.prepare.return_value = HANDLE_PATH
        connector = dict(REMOTE, dmclone=STEP)
        info = self.drv.initialize_connection(self.volume, connector)
        self.mover.prepare.assert_called_once_with(self.volume, STEP)
        self.assertEqual({'driver_volume_type': 'local',
                          'data': {'device_path': HANDLE_PATH,
                                   'volume_id': self.volume.id,
                                   'access_mode': 'rw'}}, info)
        self.mover.wants_move.assert_not_called()

    def test_prepare_step_exports_nothing(self):
        target = self.mock_object(self.drv.target_driver, 'create_export')
        self.assertEqual({}, self.drv.create_export(
            self.ctxt, self.volume, dict(REMOTE, dmclone=STEP)))
        target.assert_not_called()
        self.assertEqual({}, self.dm.devices)

    def test_remote_instance_attach_moves(self):
        self.mover.wants_move.return_value = True
        self.mover.move.return_value = {'driver_volume_type': 'local'}
        self.dm.sizes[LV_PATH] = 4194304
        info = self.drv.initialize_connection(self.volume, REMOTE)
        self.assertEqual({'driver_volume_type': 'local'}, info)
        self.mover.move.assert_called_once_with(self.volume, REMOTE,
                                                4194304)

    def test_failed_move_leaves_a_user_message(self):
        self.mover.wants_move.return_value = True
        self.mover.move.side_effect = exception.VolumeBackendAPIException(
            data='destination full')
        self.dm.sizes[LV_PATH] = 4194304
        create = self.mock_object(message_api.API, 'create')
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.drv.initialize_connection, self.volume, REMOTE)
        create.assert_called_once_with(
            mock.ANY, message_field.Action.UPDATE_ATTACHMENT,
            resource_uuid=self.volume.id,
            detail=message_field.Detail.ATTACH_ERROR)
        # For the volume's project, so that its users can list it.
        self.assertEqual(self.volume.project_id,
                         create.call_args[0][0].project_id)

    def test_user_message_failure_keeps_the_real_error(self):
        self.mover.wants_move.return_value = True
        self.mover.move.side_effect = exception.VolumeBackendAPIException(
            data='destination full')
        self.dm.sizes[LV_PATH] = 4194304
        self.mock_object(message_api.API, 'create',
                         side_effect=RuntimeError('db down'))
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.drv.initialize_connection, self.volume,
                                REMOTE)
        self.assertIn('destination full', str(exc))

    def test_move_without_service_falls_back_to_iscsi(self):
        self.mover.wants_move.return_value = True
        self.mover.move.return_value = None
        self.volume.provider_location = '10.0.0.1:3260,1 iqn.x:%s 0' % LV
        info = self.drv.initialize_connection(self.volume, REMOTE)
        self.assertEqual('iscsi', info['driver_volume_type'])
        self.mover.move.assert_called_once()

    def test_remote_attach_without_move_is_iscsi(self):
        self.volume.provider_location = '10.0.0.1:3260,1 iqn.x:%s 0' % LV
        info = self.drv.initialize_connection(self.volume, REMOTE)
        self.assertEqual('iscsi', info['driver_volume_type'])
        self.mover.wants_move.assert_called_once_with(self.volume, REMOTE)
        self.mover.move.assert_not_called()

    def test_local_attach_never_asks_the_mover(self):
        self.drv.initialize_connection(self.volume, LOCAL)
        self.mover.wants_move.assert_not_called()
        self.mover.prepare.assert_not_called()

    def test_local_attach_waits_for_and_refuses_a_move(self):
        # On the source, while a move is being prepared: the attach waits
        # for the lock and is refused, so hydration never runs under a
        # writer here.  (Before: no check at all.)
        self.mover.refuse_if_moving.side_effect = moving()
        self.assertRaises(transfer.TransferInProgress,
                          self.drv.initialize_connection, self.volume, LOCAL)
        self.mover.refuse_if_moving.assert_called_once_with(
            self.volume, mock.ANY, locked=True)

    def test_terminate_with_step_serves_it(self):
        target = self.mock_object(self.drv.target_driver,
                                  'terminate_connection')
        connector = dict(REMOTE, dmclone={'op': 'retire'})
        self.assertFalse(self.drv.terminate_connection(self.volume,
                                                       connector))
        self.mover.serve.assert_called_once_with(self.volume, connector,
                                                 {'op': 'retire'})
        self.mover.detached.assert_not_called()
        target.assert_not_called()

    def test_terminate_handled_by_transfer(self):
        self.mover.detached.return_value = True
        target = self.mock_object(self.drv.target_driver,
                                  'terminate_connection')
        self.assertFalse(self.drv.terminate_connection(self.volume, REMOTE))
        self.mover.detached.assert_called_once_with(self.volume, REMOTE)
        target.assert_not_called()

    def test_remove_export_skipped_during_transfer(self):
        self.mover.load.return_value = mock.sentinel.transfer
        self.volume.provider_location = '10.0.0.1:3260,1 iqn.x:%s 0' % LV
        target = self.mock_object(self.drv.target_driver, 'remove_export')
        self.drv.remove_export(self.ctxt, self.volume)
        target.assert_not_called()
        self.mover.load.assert_called_once_with(self.volume['id'])

    def test_extend_during_transfer(self):
        self.mover.extend.return_value = True
        self.dm.devices[HANDLE] = [dmsetup.linear_segment(0, 1024, LV_PATH)]
        target = self.mock_object(self.drv.target_driver, 'extend_target')
        self.drv.extend_volume(self.volume, 2)
        self.vg.extend_volume.assert_called_once_with(LV, '2g')
        self.mover.extend.assert_called_once_with(self.volume)
        # The mover owns the table: the handle is not refreshed here.
        self.assertEqual(1024, dmsetup.table_length(self.dm.devices[HANDLE]))
        target.assert_called_once_with(self.volume)

    def test_extend_refused_before_the_lv_grows(self):
        self.mover.refuse_extend_while_undecided.side_effect = moving()
        self.assertRaises(transfer.TransferInProgress,
                          self.drv.extend_volume, self.volume, 2)
        self.vg.extend_volume.assert_not_called()

    def test_delete_during_transfer(self):
        self.mover.delete.return_value = True
        self._make_handle()
        self.drv.delete_volume(self.volume)
        self.mover.delete.assert_called_once_with(self.volume)
        self.vg.delete.assert_not_called()
        self.assertIn(HANDLE, self.dm.devices)

    def test_delete_without_transfer(self):
        self._make_handle()
        self.drv.delete_volume(self.volume)
        self.vg.delete.assert_called_once_with(LV)

    def test_retype_retunes(self):
        new_type = {'extra_specs': {'dmclone:hydration_threshold': '8'}}
        self.assertTrue(self.drv.retype(self.ctxt, self.volume, new_type,
                                        {}, 'node-a@dmclone'))
        self.mover.retune.assert_called_once_with(self.volume, new_type)


class RefuseDuringTransferTestCase(test_driver.DriverTestBase):
    """The real Mover over the driver's Store: operations that must wait."""

    def setUp(self):
        super().setUp()
        self.db.volume_admin_metadata_get.return_value = dict(
            transfer_metadata(), dmclone_percent='37.5')

    def _check(self, exc, action):
        self.assertIn(action, str(exc))
        self.assertIn('node-b to node-a', str(exc))
        self.assertIn('37.5%', str(exc))

    def test_create_snapshot(self):
        exc = self.assertRaises(transfer.TransferInProgress,
                                self.drv.create_snapshot, self._snapshot())
        self._check(exc, 'a snapshot')
        self.vg.create_lv_snapshot.assert_not_called()

    def test_lvm_temporary_snapshot_is_allowed(self):
        # The LVM driver snapshots a clone source with a plain dict.
        self.drv.create_snapshot({'name': 'clone-snap-x', 'volume_name': LV,
                                  'volume_size': 1, 'id': 'x'})
        self.vg.create_lv_snapshot.assert_called_once()

    def test_create_cloned_volume(self):
        src = fake_volume.fake_volume_obj(self.ctxt, id=fake.VOLUME_ID)
        clone = fake_volume.fake_volume_obj(self.ctxt, id=fake.VOLUME2_ID)
        exc = self.assertRaises(transfer.TransferInProgress,
                                self.drv.create_cloned_volume, clone, src)
        self._check(exc, 'cloning it')
        self.vg.create_volume.assert_not_called()

    def test_revert_to_snapshot(self):
        self._make_handle()
        exc = self.assertRaises(transfer.TransferInProgress,
                                self.drv.revert_to_snapshot, self.ctxt,
                                self.volume, self._snapshot())
        self._check(exc, 'a revert to a snapshot')
        self.assertIn(HANDLE, self.dm.devices)
        self.vg.revert.assert_not_called()

    def test_remove_export_is_skipped_on_the_source(self):
        # The source's export feeds the clone until the transfer ends.
        self.db.volume_admin_metadata_get.return_value = transfer_metadata(
            source='node-a', dest='node-b')
        self.volume.provider_location = '10.0.0.1:3260,1 iqn.x:%s 0' % LV
        target = self.mock_object(self.drv.target_driver, 'remove_export')
        self.drv.remove_export(self.ctxt, self.volume)
        target.assert_not_called()

    def test_remove_export_on_the_destination_keeps_the_sources(self):
        # The record still names the source's export: not ours to remove.
        self.volume.provider_location = '10.0.0.2:3260,1 iqn.x:%s 0' % LV
        target = self.mock_object(self.drv.target_driver, 'remove_export')
        self.drv.remove_export(self.ctxt, self.volume)
        target.assert_not_called()

    def test_no_remote_export_while_moving(self):
        # An export to a third node would hold the clone open and outlive
        # a rollback: refused before anything is exported.
        target = self.mock_object(self.drv.target_driver, 'create_export')
        exc = self.assertRaises(
            transfer.TransferInProgress, self.drv.create_export, self.ctxt,
            self.volume, {'host': 'node-c', 'initiator': 'iqn.x:c'})
        self._check(exc, 'attaching on node-c')
        target.assert_not_called()
        self.assertNotIn(HANDLE, self.dm.devices)

    def test_local_export_while_moving_is_fine(self):
        self._make_handle()
        self.assertEqual({}, self.drv.create_export(
            self.ctxt, self.volume, {'host': 'node-a'}))

    def test_invalid_state_refuses_too(self):
        self.db.volume_admin_metadata_get.return_value = dict(
            transfer_metadata(), dmclone_region_sectors='100')
        self.assertRaises(transfer.TransferStateInvalid,
                          self.drv.create_snapshot, self._snapshot())


class NoTransferTestCase(test_driver.DriverTestBase):

    def test_wants_move_only_for_instances(self):
        self.volume.volume_attachment = objects.VolumeAttachmentList(
            objects=[objects.VolumeAttachment(
                id=fake.ATTACHMENT_ID, instance_uuid=None,
                attach_status=fields.VolumeAttachStatus.RESERVED)])
        self.volume.provider_location = '10.0.0.1:3260,1 iqn.x:%s 0' % LV
        move = self.mock_object(mover.Mover, 'move')
        info = self.drv.initialize_connection(self.volume, REMOTE)
        self.assertEqual('iscsi', info['driver_volume_type'])
        move.assert_not_called()

    def test_extend_and_delete_without_transfer(self):
        self._make_handle()
        self.dm.sizes[LV_PATH] = 4194304
        self.drv.extend_volume(self.volume, 2)
        self.assertEqual(4194304,
                         dmsetup.table_length(self.dm.devices[HANDLE]))
        self.drv.delete_volume(self.volume)
        self.vg.delete.assert_called_once_with(LV)


@ddt.ddt
class WiringTestCase(test_driver.DriverTestBase):

    def test_mover(self):
        drv = self._make_driver(dmclone_node_aliases=['node-a.example.org'],
                                dmclone_region_size=256)
        m = drv.mover
        self.assertIs(m, drv.mover)
        self.assertEqual({'node-a', 'node-a.example.org'}, m.node_names)
        self.assertEqual('node-a', m.node_name)
        self.assertEqual(512, m.region_sectors)
        self.assertIs(drv.store, m.store)
        self.assertIs(drv.peer, m.peer)
        self.assertIs(drv.target_driver, m.target_driver)
        self.assertEqual(drv._hydration_tuning, m.tuning)
        self.assertEqual(drv._retire_local, m.retire_local)

    @mock.patch.object(volume_utils, 'brick_get_connector')
    def test_destination_node(self, mock_connector):
        self.drv.metadata_vg = mock.sentinel.meta_vg
        dest = self.drv.mover.destination()
        self.assertIs(dest, self.drv.mover.destination())
        mock_connector.assert_called_once_with(
            'ISCSI', use_multipath=False, device_scan_attempts=mock.ANY)
        self.assertIs(mock_connector.return_value, dest.connector)
        self.assertIs(self.vg, dest.vg)
        self.assertIs(mock.sentinel.meta_vg, dest.meta_vg)
        self.assertIs(self.dm, dest.dm)
        self.assertEqual('default', dest.lvm_type)
        self.assertEqual(2.0, dest.metadata_reserve)

    @mock.patch.object(volume_utils, 'brick_get_connector')
    def test_destination_node_shares_the_vg(self, mock_connector):
        self.assertIs(self.vg, self.drv._destination_node().meta_vg)

    @mock.patch.object(volume_utils, 'brick_get_connector_properties',
                       return_value={'host': 'node-a.example.org',
                                     'initiator': 'iqn.x'})
    def test_own_connector(self, mock_props):
        props = self.drv.mover.own_connector()
        self.assertEqual({'host': 'node-a', 'initiator': 'iqn.x'}, props)
        self.drv.mover.own_connector()
        mock_props.assert_called_once_with()

    def test_retire_local(self):
        self._make_handle()
        self.drv._retire_local(self.volume)
        self.assertNotIn(HANDLE, self.dm.devices)
        self.vg.delete.assert_called_once_with(LV)
        self.lvs.clear()
        self.drv._retire_local(self.volume)
        self.vg.delete.assert_called_once_with(LV)

    @mock.patch.object(volume_utils, 'clear_volume')
    def test_retire_local_wipes_the_old_copy(self, mock_clear):
        # The moved volume's extents go to the next thick LV here,
        # another tenant's perhaps.  (Before: removed without a wipe.)
        self.drv.configuration.volume_clear = 'zero'
        self.drv.configuration.volume_clear_size = 0
        self.drv.wiper._spawn = lambda fn, *args: fn(*args)
        self._make_handle()
        order = []
        mock_clear.side_effect = lambda *a, **k: order.append(('wipe', a[1]))
        self.vg.rename_volume.side_effect = lambda old, new: (
            order.append(('rename', old, new)),
            self.dm.sizes.__setitem__(
                '/dev/%s/%s' % (test_driver.VG, new), self.dm.sizes[LV_PATH]))
        self.vg.delete.side_effect = lambda name: order.append(
            ('delete', name))
        self.drv._retire_local(self.volume)
        retiring = order[0][2]
        self.assertTrue(retiring.startswith(LV + '-dmcwipe-'))
        self.assertEqual([('rename', LV, retiring),
                          ('wipe', '/dev/%s/%s' % (test_driver.VG, retiring)),
                          ('delete', retiring)], order)
        mock_clear.assert_called_once_with(
            1024, mock.ANY, volume_clear='zero', volume_clear_size=0,
            volume_clear_ionice=self.drv.configuration.volume_clear_ionice)

    @ddt.data(dict(volume_clear='none'),
              dict(volume_clear='zero', lvm_type='thin'))
    @mock.patch.object(volume_utils, 'clear_volume')
    def test_no_wipe_when_not_needed(self, config, mock_clear):
        for key, value in config.items():
            setattr(self.drv.configuration, key, value)
        self.drv._wipe(LV_PATH, 1024)
        mock_clear.assert_not_called()

    @mock.patch.object(volume_utils, 'brick_get_connector')
    def test_destination_wipes_with_the_driver(self, mock_connector):
        self.assertEqual(self.drv.wiper.discard,
                         self.drv._destination_node().discard)
        self.assertIs(self.drv.wiper, self.drv.wiper)
        self.assertIsNone(self.drv.wiper.wipe)      # volume_clear = none

    def test_monitor_wired_to_mover(self):
        self.mock_object(test_driver.driver.periodic.HydrationMonitor,
                         'start')
        self.drv._start_monitor()
        monitor = self.drv.monitor
        self.assertEqual(self.drv.mover.on_status, monitor._on_status)
        self.assertEqual(self.drv.mover.finalize_pending,
                         monitor._after_tick)
        self.assertEqual(test_driver.VG, monitor._volume_group)

    # -- hydration tuning ----------------------------------------------------

    @ddt.data(None, {}, {'extra_specs': None}, {'extra_specs': {}},
              {'extra_specs': {'other': 'x'}})
    def test_tuning_defaults(self, volume_type):
        self.assertEqual((64, 16), self.drv._hydration_tuning(volume_type))

    def test_tuning_from_config(self):
        drv = self._make_driver(dmclone_hydration_threshold=8,
                                dmclone_hydration_batch_size=4)
        self.assertEqual((8, 4), drv._hydration_tuning(None))

    @ddt.data(({'dmclone:hydration_threshold': '128'}, (128, 16)),
              ({'dmclone:hydration_batch_size': '1'}, (64, 1)),
              ({'dmclone:hydration_threshold': 2,
                'dmclone:hydration_batch_size': '32'}, (2, 32)))
    @ddt.unpack
    def test_tuning_extra_specs(self, specs, expected):
        self.assertEqual(expected, self.drv._hydration_tuning(
            {'extra_specs': specs}))

    @ddt.data('0', '-1', 'x', '1.5', '')
    def test_tuning_invalid(self, value):
        exc = self.assertRaises(
            exception.InvalidVolumeType, self.drv._hydration_tuning,
            {'extra_specs': {'dmclone:hydration_batch_size': value}})
        self.assertIn('dmclone:hydration_batch_size=%r must be a positive '
                      'integer' % value, str(exc))

    # -- recovery ------------------------------------------------------------

    def test_recover_without_db(self):
        self.drv.db = None
        recover = self.mock_object(mover.Mover, 'recover')
        self.drv._recover_transfers()
        recover.assert_not_called()

    def test_recover_collects_volumes(self):
        here = fake_volume.fake_volume_obj(self.ctxt, id=fake.VOLUME_ID)
        moving_in = fake_volume.fake_volume_obj(self.ctxt,
                                                id=fake.VOLUME2_ID)
        self.drv.metadata_vg = mock.Mock()
        self.drv.metadata_vg.get_volumes.return_value = [
            {'name': 'volume-%s-dmcmeta' % fake.VOLUME_ID},
            {'name': 'volume-%s-dmcmeta' % fake.VOLUME2_ID},
            {'name': 'volume-%s-dmcmeta' % fake.VOLUME3_ID},
            {'name': 'legacy-dmcmeta'},
            {'name': 'volume-%s' % fake.VOLUME4_ID}]
        by_host = self.mock_object(objects.VolumeList, 'get_all_by_host',
                                   return_value=[here])

        def get_by_id(ctxt, volume_id):
            if volume_id == fake.VOLUME2_ID:
                return moving_in
            raise exception.VolumeNotFound(volume_id=volume_id)
        get = self.mock_object(objects.Volume, 'get_by_id',
                               side_effect=get_by_id)
        recover = self.mock_object(mover.Mover, 'recover')
        self.drv._recover_transfers()
        by_host.assert_called_once_with(mock.ANY, 'node-a@dmclone#dmclone')
        # Named by metadata LVs and not of this host: looked up by id.
        self.assertEqual([fake.VOLUME2_ID, fake.VOLUME3_ID],
                         [c.args[1] for c in get.call_args_list])
        recover.assert_called_once_with(
            [here, moving_in],
            ['volume-%s-dmcmeta' % fake.VOLUME_ID,
             'volume-%s-dmcmeta' % fake.VOLUME2_ID,
             'volume-%s-dmcmeta' % fake.VOLUME3_ID,
             'legacy-dmcmeta'])

    # -- handles -------------------------------------------------------------

    def test_no_linear_handle_over_a_clone_in_progress(self):
        self.lvs[LV + '-dmcmeta'] = '0.01'
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.drv._ensure_handle, self.volume)
        self.assertIn('being hydrated by a transfer', str(exc))
        self.assertNotIn('create', [c[0] for c in self.dm.calls])
        self.assertEqual({}, self.dm.devices)

    def test_no_linear_handle_with_metadata_in_its_own_vg(self):
        self.drv.metadata_vg = mock.Mock()
        self.drv.metadata_vg.get_volume.return_value = {'name': 'x'}
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.drv.ensure_export, self.ctxt, self.volume)
        self.drv.metadata_vg.get_volume.assert_called_once_with(
            LV + '-dmcmeta')
        self.assertEqual({}, self.dm.devices)

    @ddt.data(transfer.PREPARING, transfer.CLONED, transfer.HYDRATING)
    def test_no_linear_handle_while_moving_in_without_metadata(self, state):
        # The record says the volume is moving here and its LV holds only
        # what was copied so far: even with its metadata LV lost, a start
        # (ensure_export) must not map that LV alone.
        self.db.volume_admin_metadata_get.return_value = transfer_metadata(
            state=state, dest='node-a', source='node-b')
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.drv.ensure_export, self.ctxt,
                                self.volume)
        self.assertIn('being hydrated by a transfer', str(exc))
        self.assertEqual({}, self.dm.devices)

    @ddt.data(
        # (Finalizing: hydration was complete; the swap may have happened.)
        (transfer.FINALIZING, 'node-a', 'node-b'),
        # Moving away from here: this node's LV is the complete source.
        (transfer.HYDRATING, 'node-b', 'node-a'),
        (transfer.CLONED, 'node-b', 'node-a'),
        (transfer.ABORTED, 'node-a', 'node-b'))
    @ddt.unpack
    def test_linear_handle_over_a_complete_lv(self, state, dest, source):
        self.db.volume_admin_metadata_get.return_value = transfer_metadata(
            state=state, dest=dest, source=source)
        self.assertEqual(HANDLE_PATH, self.drv._ensure_handle(self.volume))
        self.assertEqual('linear', self.dm.devices[HANDLE][0].target)

    def test_existing_clone_handle_is_kept(self):
        self.lvs[LV + '-dmcmeta'] = '0.01'
        clone = [dmsetup.clone_segment(0, 2097152, '/dev/m', LV_PATH,
                                       '/dev/sdb', 128)]
        self.dm.devices[HANDLE] = clone
        self.assertEqual(HANDLE_PATH, self.drv._ensure_handle(self.volume))
        self.assertEqual(clone, self.dm.devices[HANDLE])
