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

"""Two nodes over in-memory fakes, for transfer and crash tests.

Each :class:`Node` has what a node's volume service has: device-mapper
(FakeDMSetup), a volume group (FakeLVM), an iSCSI initiator
(FakeConnector), a target driver (FakeTarget) and a real
:class:`~cinder_dmclone.service.MoveService` (source, destination, peer
endpoint, recovery, monitor) over a real Store, Clones and PeerClient.  Both
nodes share one FakeDB; PeerClient calls travel through
:class:`FakeVolumeRPC` (only the transport is replaced) to the other node's
driver-like entry points, which hand every step to the node's endpoint.

A step that raises :class:`Crash` kills its node's service: the caller of
an RPC sees a timeout, the node restarts (a fresh service over the same
kernel, LVM and database state) and runs recovery, as cinder-volume does
at start.  The fakes record every violation of what must never happen
(a linear handle over a partly hydrated LV, a metadata LV zeroed twice or
used unzeroed, an iSCSI session dropped under a live table, a lock taken
twice) in ``Cluster.violations``.
"""

import itertools

import fixtures
from oslo_concurrency import processutils
import oslo_messaging
from oslo_utils import excutils

from cinder import context
from cinder import exception
from cinder import objects
from cinder.objects import fields
from cinder.tests.unit import fake_constants as fake
from cinder.tests.unit import fake_volume
from cinder.volume import volume_utils

from cinder_dmclone import clone
from cinder_dmclone import dmsetup
from cinder_dmclone import evidence
from cinder_dmclone import exception as dmc_exception
from cinder_dmclone import layout
from cinder_dmclone import map_mark
from cinder_dmclone import move
from cinder_dmclone import peer
from cinder_dmclone import privileged
from cinder_dmclone import recovery
from cinder_dmclone import region_map
from cinder_dmclone import service
from cinder_dmclone import wiper
from tests.harness import manager_flow
from tests.unit import fakes

VG = 'dmc-vg'
REGION = 128
VOLUME_ID = fake.VOLUME_ID
LV = 'volume-%s' % VOLUME_ID
LV_PATH = '/dev/%s/%s' % (VG, LV)
META = LV + '-dmcmeta'
HANDLE = layout.handle_name(VG, LV)
HANDLE_PATH = layout.handle_path(VG, LV)
SECTORS = 2097152
TUNING = (64, 16)


class Crash(BaseException):
    """A volume service dying right here.

    Not an Exception: no ``except Exception`` handler of the code under
    test runs, as none would in a process that died.
    """


class Node(object):
    """One node: its kernel, LVM, initiator, target and volume service."""

    def __init__(self, cluster, name, ip):
        self.cluster = cluster
        self.name = name
        self.host = '%s@dmclone#dmclone' % name
        self.az = 'az-%s' % name
        self.dm = fakes.FakeDMSetup()
        self.dm.strict = True
        self.dm.check_table = self._check_table
        self.dm.on_hydrated = self._hydrated
        self.vg = fakes.FakeLVM(VG, self.dm)
        self.connector = fakes.FakeConnector(
            self.dm, cluster.resolve, on_disconnect=self._disconnecting)
        self.target = fakes.FakeTarget(
            ip, device_exists=lambda path: self.dm.exists(
                path.rsplit('/', 1)[-1]))
        # (The move's start time on the monitors' clock.)
        self.store = move.Store(cluster.db, clock=lambda: cluster.now)
        self.props = {'host': name, 'ip': ip,
                      'initiator': 'iqn.2024-01.org.example.%s:i' % name}
        self.peer = peer.PeerClient(rpcapi=cluster.rpc, node_name=name,
                                    connector=self.props)
        #: devices wiped before their LV went (volume_clear = zero here).
        self.wiped = []
        #: the node's thin pool (a thin cluster), its data LVs thin.
        self.pool = fakes.FakeThinPool(VG) if cluster.thin else None
        self.dest = clone.Clones(
            self.dm, self.vg, self.vg, self.connector, self.execute, 'sudo',
            lvm_type='thin' if cluster.thin else 'default',
            thin_map=cluster.thin_map)
        self.dm.check_discard = self._check_discard
        #: the service's state directory (records of held metadata
        #: snapshots): on disk, so it outlives restarts and reboots.
        self.state_dir = cluster.test.useFixture(fixtures.TempDir()).path
        #: the node's own marks of clones thin mapped here (under it too).
        self.marks = map_mark.MapMarks(
            map_mark.marks_dir(self.state_dir, name))
        #: and of a move's end begun here.
        self.end_marks = map_mark.MapMarks(
            map_mark.marks_dir(self.state_dir, name, map_mark.ENDING))
        #: and of the move it takes part in.
        self.part_marks = map_mark.MapMarks(
            map_mark.marks_dir(self.state_dir, name, map_mark.MOVING),
            read_limit=evidence.READ_LIMIT)
        self.executed = []
        #: ``lvs`` of the volume group fails as LVM's does while the
        #: group is not found (a PV not scanned yet after a reboot).
        self.vg_unlisted = False
        self.has_service = True
        self.service_up = True
        self.disabled = False
        self.down = False
        self.restart()

    # -- the service ------------------------------------------------------

    def restart(self):
        """A fresh service over the same kernel, LVM and database."""
        # (Old copies are wiped in the background; here, at once.)
        self.wiper = wiper.Wiper(self.vg, self.dm, wipe=self._wipe,
                                 spawn=lambda fn, *args: fn(*args),
                                 lv_names=lambda: self.dest.lv_names(VG))
        self.dest.discard = lambda name: self.wiper.discard(name)
        self.moves = service.MoveService(
            node_names={self.name}, node_name=self.name, store=self.store,
            peer_client=self.peer, clones=self.dest,
            target_driver=self.target, dm=self.dm, volume_group=VG,
            wiper=self.wiper, region_sectors=REGION, tuning=TUNING,
            interval=10, ensure_export=self._export_moving_away,
            clock=lambda: self.cluster.now,
            thin_maps=self.thin_maps() if self.cluster.thin_map else None,
            map_marks=self.marks, end_marks=self.end_marks,
            part_marks=self.part_marks)
        self.source = self.moves.source
        self.source._lio_acls = self._acls
        self.source._lio_target_exists = (
            lambda iqn: iqn in self.target.exports)
        self.destination = self.moves.destination
        self.endpoint = self.moves.endpoint
        self.tracker = self.moves.tracker
        self.monitor = self.moves.monitor
        self.down = False

    def thin_maps(self):
        """DMCloneVolumeDriver._thin_maps."""
        return region_map.ThinMaps(self.name, VG, self.state_dir,
                                   execute=self.execute, root_helper='sudo')

    def _acls(self, target_iqn):
        """privileged.lio_acls over this node's target."""
        export = self.target.exports.get(target_iqn, {})
        return frozenset(i.lower() for i in export.get('acl', ()))

    def _export_moving_away(self, volume):
        """DMCloneVolumeDriver._ensure_export_moving_away."""
        self.ensure_handle()
        self.target.ensure_export(self.cluster.ctxt, volume, HANDLE_PATH)

    def reboot(self):
        """Device-mapper tables, LIO targets and iSCSI sessions are gone.

        LVs stay, and so does LIO's saved configuration.
        """
        self.target.reboot()
        self.dm.devices.clear()
        self.dm.uuids.clear()
        self.dm.hydration.clear()
        for path in self.connector.sessions.values():
            self.dm.sizes.pop(path, None)
        self.connector.sessions.clear()
        self.restart()

    def recover(self):
        """DMCloneVolumeDriver._recover_transfers, then the wiper's resume."""
        volumes = recovery.volumes_touching(self.cluster.ctxt, self.host,
                                            {self.name})
        meta_lvs = [lv['name'] for lv in self.vg.get_volumes()
                    if layout.lv_name_from_metadata_lv(lv['name'])]
        self.moves.recovery.recover(volumes, meta_lvs)
        lv_names = [lv['name'] for lv in self.vg.get_volumes()]
        self.moves.recovery.report_lost_copies(
            recovery.volumes_with_old_copies(
                self.cluster.ctxt, {self.name}, lv_names, volumes))
        self.moves.recovery.report_lvs_of_deleted_volumes(
            recovery.lvs_of_deleted_volumes(self.cluster.ctxt, lv_names,
                                            volumes))
        self.thin_maps().release_leftovers()
        self.wiper.resume()

    def execute(self, *cmd, **kwargs):
        """The node's root commands (privileged.py builds them all).

        Each must run under ``LC_ALL=C``; ``dd`` zeroes its LV's head.
        """
        self.executed.append(cmd)
        if cmd[:2] != privileged.ENV_PREFIX:
            self.cluster.violation('%s: %r not run under LC_ALL=C'
                                   % (self.name, cmd))
        cmd = cmd[2:]
        if cmd[0] == 'dd':
            path = [a for a in cmd if a.startswith('of=')][0][3:]
            if self._tables_using(path):
                self.cluster.violation('%s: zeroed %s under a live clone'
                                       % (self.name, path))
            lv = self.vg.zero(path)
            if lv['zeroed'] > 1:
                self.cluster.violation('%s: metadata LV %s zeroed again'
                                       % (self.name, path))
        if cmd[0] == 'blkdiscard':
            if '--zeroout' in cmd:
                self.cluster.violation('%s: zeroes written through a clone'
                                       % self.name)
            offset = int(cmd[cmd.index('--offset') + 1])
            length = int(cmd[cmd.index('--length') + 1])
            self.dm.discard(cmd[-1].rsplit('/', 1)[-1], offset // 512,
                            length // 512)
        if cmd[0] == 'lvs' and self.vg_unlisted:
            raise processutils.ProcessExecutionError(
                exit_code=5, cmd=' '.join(cmd),
                stderr='  Volume group "%s" not found\n  Cannot process '
                'volume group %s\n' % (VG, VG))
        if self.pool is not None:
            out = self.pool.run(cmd, {name: lv['bytes'] for name, lv
                                      in self.vg.lvs.items()})
            if out is not None:
                return out
        elif cmd[0] == 'lvs' and cmd[-1] == VG:
            # (privileged.thin_lvs of a thick group: every LV, no pool.)
            return ''.join('  %s|%d|||||\n' % (name, lv['bytes'])
                           for name, lv in sorted(self.vg.lvs.items())), ''
        return '', ''

    def _wipe(self, path, size_mb):
        if self._tables_using(path):
            self.cluster.violation('%s: wiped %s under a live table'
                                   % (self.name, path))
        self.wiped.append(path)

    # -- invariants -------------------------------------------------------

    def _tables_using(self, path):
        return [name for name, segs in self.dm.devices.items()
                if any(path in seg.args for seg in segs)]

    def _check_table(self, name, segments):
        for seg in segments:
            if seg.target == 'linear' and seg.args[1] == 0:
                lv = self.vg.by_path(seg.args[0])
                if lv is not None and not lv['complete']:
                    self.cluster.violation(
                        '%s: linear table over %s, which is not fully '
                        'hydrated' % (self.name, seg.args[0]))
            if seg.target == 'clone':
                meta = self.vg.by_path(seg.args[0])
                if meta is None or meta['zeroed'] != 1:
                    self.cluster.violation(
                        '%s: clone over metadata %s zeroed %s times'
                        % (self.name, seg.args[0],
                           meta and meta['zeroed']))

    def _check_discard(self, name, first, end):
        """A discard through clone ``name`` of regions [first, end).

        It marks them hydrated without a copy: only on a clone that
        nothing has opened, with hydration off and no_discard_passdown,
        no region hydrated otherwise, over an LV that reads zeroes, and
        never over a region the source holds data in.
        """
        seg = self.dm._clone(name)
        args = dmsetup.parse_clone_table(seg)
        bad = []
        if self.dm.hydration.get(name):
            bad.append('with hydration on')
        if 'no_discard_passdown' not in args.features:
            bad.append('passed down to the data LV')
        if self.dm.openers.get(name):
            bad.append('while the clone is open')
        copied = self.dm.meta_hydrated.get(args.metadata_dev, 0) - len(
            self.dm.discarded.get(args.metadata_dev, ()))
        if copied:
            bad.append('after %d regions were hydrated' % copied)
        if self.pool is None or not self.pool.zeroing \
                or self.dest.lvm_type != 'thin':
            bad.append('over an LV that does not read zeroes')
        held = self.cluster.source_regions(args.region_size) & set(
            range(first, end))
        if held:
            bad.append('over regions the source holds data in: %s'
                       % sorted(held)[:5])
        for why in bad:
            self.cluster.violation('%s: regions %d-%d of %s discarded %s'
                                   % (self.name, first, end, name, why))

    def _hydrated(self, device):
        lv = self.vg.by_path(device)
        if lv is not None:
            lv['complete'] = True

    def _disconnecting(self, path):
        if self._tables_using(path):
            self.cluster.violation('%s: session %s dropped under a live '
                                   'table' % (self.name, path))

    # -- what the driver and the volume manager do -------------------------

    def ensure_handle(self):
        if not self.dm.exists(HANDLE):
            self.dm.create(HANDLE, [dmsetup.linear_segment(
                0, self.dm.device_sectors(LV_PATH), LV_PATH)],
                uuid=layout.handle_uuid(VG, LV))
        return HANDLE_PATH

    def ensure_export(self):
        """The volume manager at start: DMCloneVolumeDriver.ensure_export.

        A missing handle is rebuilt, except over an LV that a transfer's
        metadata LV says is still hydrating (_refuse_linear_over_clone);
        an export of this node's is restored.
        """
        if not self.dm.exists(HANDLE) and LV in self.vg.lvs and \
                META not in self.vg.lvs:
            self.ensure_handle()
        volume = self.cluster.volume()
        location = volume.get('provider_location') or ''
        if location.startswith(self.target.ip + ':'):
            # (Its export is this node's: LIO's helper restores every
            # saved target if the kernel has none.)
            self.target.ensure_export(self.cluster.ctxt, volume, HANDLE_PATH)

    @staticmethod
    def _local(volume, path):
        return {'driver_volume_type': 'local',
                'data': {'device_path': path, 'volume_id': volume['id'],
                         'access_mode': 'rw'}}

    def _save(self, volume, update):
        self.cluster.db.volume_update(self.cluster.ctxt, volume.id, update)
        volume.update(update)

    def attach(self, volume, connector):
        """The volume manager's attach: tests.harness.manager_flow."""
        return manager_flow.initialize_connection(
            self, self.cluster.ctxt, volume, connector, self._save)

    def validate_connector(self, connector):
        """DMCloneVolumeDriver.validate_connector (the fake target's)."""

    def create_export(self, ctxt, volume, connector):
        """DMCloneVolumeDriver.create_export."""
        step = peer.payload(connector)
        if step:
            self.endpoint.check(volume, step, peer.BY_INITIALIZE)
            return {}
        if connector['host'] == self.name:
            self.ensure_handle()
            return {}
        self.source.end_stale_prepare(volume)
        self.source.refuse_if_moving(volume, 'attaching on %s'
                                     % connector['host'])
        path = self.ensure_handle()
        update = self.source.export_for_attach(
            volume, lambda: self.target.create_export(ctxt, volume, path),
            connector)
        return {'provider_location': update['location'],
                'provider_auth': update['auth']}

    def initialize_connection(self, volume, connector):
        """DMCloneVolumeDriver.initialize_connection."""
        step = peer.payload(connector)
        if step:
            return self._local(volume, self.endpoint.receive(
                volume, connector, step, peer.BY_INITIALIZE))
        if connector['host'] == self.name:
            self.source.refuse_local_attach(volume, 'attaching it here')
            return self._local(volume, self.ensure_handle())
        try:
            if self.source.wants_move(volume, connector):
                info = self.source.move(
                    volume, connector,
                    lambda: self.dm.device_sectors(LV_PATH))
                if info is not None:
                    return info
            return self.source.connect_over_iscsi(
                volume, connector, self.target.initialize_connection)
        finally:
            self.source.attach_done(volume, connector)

    def terminate_connection(self, volume, connector, force=False):
        """DMCloneVolumeDriver.terminate_connection."""
        step = peer.payload(connector)
        if step:
            self.endpoint.receive(volume, connector, step, peer.BY_TERMINATE)
            return False
        self.source.finish_rollback(volume)
        if self.destination.detached(volume, connector):
            return False
        if connector['host'] == self.name:
            return len(volume.volume_attachment) > 1
        if self.source.keeps_acl(volume, connector):
            self.source.pass_on_detach(volume, connector)
            return False
        self.target.terminate_connection(volume, connector)
        return False

    def remove_export(self, ctxt, volume):
        """DMCloneVolumeDriver.remove_export (and its _owns_export)."""
        if self.source.keeps_export(volume):
            return
        location = volume.get('provider_location') or ''
        if not location.startswith(self.target.ip + ':'):
            return
        self.target.remove_export(ctxt, volume)

    def scheduler_host(self):
        """This node's pool as Cinder's scheduler hands it to a migration."""
        return {'host': self.host,
                'capabilities': {'volume_backend_name': 'dmclone',
                                 'dmclone_node': self.name,
                                 'dmclone_initiator': self.props['initiator']}}

    def migrate_volume(self, ctxt, volume, host):
        """DMCloneVolumeDriver.migrate_volume (and _migration_connector)."""
        caps = host.get('capabilities') or {}
        node = caps.get('dmclone_node')
        connector = None
        if (node and node != self.name and caps.get('dmclone_initiator')
                and host['host'] == '%s@dmclone#dmclone' % node
                and not volume.volume_attachment):
            connector = {'host': node,
                         'initiator': caps['dmclone_initiator']}
        self.source.end_stale_prepare(volume)
        self.source.refuse_if_moving(volume, 'a migration to %s' % (
            connector['host'] if connector else host['host']))
        if connector is None:
            return False, None
        try:
            self._save(volume, self.create_export(ctxt, volume, connector))
            try:
                info = self.source.move(
                    volume, connector,
                    lambda: self.dm.device_sectors(LV_PATH), migration=True)
            except Exception:
                with excutils.save_and_reraise_exception():
                    self._drop_migration_export(ctxt, volume, connector)
            if info is None:
                kept = self._drop_migration_export(ctxt, volume, connector)
                if kept:
                    raise dmc_exception.VolumeNotMovable(
                        volume=volume['id'], node=self.name, reason=kept)
                return False, None
        finally:
            self.source.attach_done(volume, connector)
        return True, None

    def _drop_migration_export(self, ctxt, volume, connector):
        """DMCloneVolumeDriver._drop_migration_export."""
        def remove():
            self.remove_export(ctxt, volume)
            self._save(volume, {'provider_location': None,
                                'provider_auth': None})
        try:
            return self.source.drop_migration_export(volume, connector,
                                                     remove)
        except Exception:
            # (the driver logs it: the migration's error stands)
            return 'the export could not be removed'

    def attachment_delete(self, volume, connector):
        """VolumeManager.attachment_delete: tests.harness.manager_flow."""
        manager_flow.terminate_connection(self, self.cluster.ctxt, volume,
                                          connector)

    def delete_volume(self, volume):
        """DMCloneVolumeDriver.delete_volume."""
        if self.destination.delete(volume):
            return
        self.source.give_up_aborted(volume)
        self.dm.remove(HANDLE)
        if LV in self.vg.lvs:
            self.vg.delete(LV)
        self.source.end_every_part(volume['id'])


class FakeLock(object):
    """A tooz lock of the cluster's coordination backend (in memory).

    Names in ``cluster.busy`` are held by someone outside the test: a
    blocking acquire of one is a violation (the test would hang), a
    non-blocking one fails.
    """

    def __init__(self, cluster, name):
        self.cluster = cluster
        self.name = name

    def acquire(self, blocking=True):
        """tooz's: ``blocking`` True, False or a bound in seconds."""
        c = self.cluster
        if self.name in c.held:
            # A distributed lock is not reentrant: this would deadlock
            # (or wait out its bound for nothing).
            c.violation('lock %s taken twice' % self.name)
            raise AssertionError('deadlock on %s' % self.name)
        if self.name in c.busy:
            if blocking is True:
                c.violation('waited for the busy lock %s' % self.name)
                raise AssertionError('waited for %s' % self.name)
            # (a bounded wait ends without it)
            return False
        c.held.add(self.name)
        return True

    def release(self):
        self.cluster.held.discard(self.name)

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


class FakeVolumeRPC(object):
    """cinder.volume.rpcapi.VolumeAPI, delivering to a Node in-process."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.calls = []

    def initialize_connection(self, ctxt, volume, connector):
        self.calls.append(('initialize_connection', volume.host,
                           peer.payload(connector)))
        node = self.cluster.node_of(volume.host)
        # The volume object travels; the routed copy names the callee.
        # (The manager's RPC endpoint runs its whole attach flow.)
        return self.cluster.call(node, node.attach, volume, connector)

    def terminate_connection(self, ctxt, volume, connector, force=False):
        self.calls.append(('terminate_connection', volume.host,
                           peer.payload(connector)))
        node = self.cluster.node_of(volume.host)
        # Only the id travels; the manager loads the volume.
        return self.cluster.call(node, node.terminate_connection,
                                 self.cluster.volume(volume.id), connector)


class Cluster(object):
    """node-a and node-b sharing one database; one volume on node-a."""

    def __init__(self, test, restart_before_timeout=True, reboot=False,
                 thin=False, thin_map=False, mapped=((0, 16), (8000, 8100))):
        self.test = test
        #: the nodes' data LVs are thin LVs of a pool; the volume's maps
        #: the block ranges ``mapped`` (64 KiB blocks) on node-a.
        self.thin = thin
        #: both nodes move only a thin volume's data (dmclone_thin_map).
        self.thin_map = thin_map
        #: a crashed node reboots (kernel state lost) instead of restarting
        #: its service only.
        self.reboot = reboot
        self.ctxt = context.get_admin_context()
        self.db = fakes.FakeDB()
        self.rpc = FakeVolumeRPC(self)
        self.violations = []
        self.attachments = []
        self.snapshots = []
        self.held = set()
        #: the monitors' clock (seconds); each tick moves it on.
        self.now = 0.0
        #: lock names held by someone outside the test (see FakeLock).
        self.busy = set()
        #: raised when a lock is asked for (the coordination backend down).
        self.lock_error = None
        self.restart_before_timeout = restart_before_timeout
        self.deleted = False
        #: the volume's multiattach flag (its volume type's).
        self.multiattach = False
        #: attachment ids: Cinder's fake ones, then new ones (an attach
        #: that failed leaves its attachment: see attach).
        self._ids = itertools.chain(
            [fake.ATTACHMENT_ID, fake.ATTACHMENT2_ID],
            ('%08x-0000-4000-8000-000000000000' % n
             for n in itertools.count(3)))
        #: the volume's id; its LV is ``LV`` whatever it is (see
        #: give_name_id).
        self.volume_id = VOLUME_ID
        self.a = Node(self, 'node-a', '10.0.0.1')
        self.b = Node(self, 'node-b', '10.0.0.2')
        self.nodes = {'node-a': self.a, 'node-b': self.b}
        test.mock_object(objects.Volume, 'get_by_id',
                         side_effect=lambda ctxt, vid: self.volume(vid))
        test.mock_object(objects.Service, 'get_by_args',
                         side_effect=self._service)
        test.mock_object(objects.VolumeList, 'get_all_by_host',
                         side_effect=self._volumes_by_host)
        test.mock_object(objects.VolumeList, 'get_all',
                         side_effect=self._volumes_by_metadata)
        test.mock_object(objects.SnapshotList, 'get_all_for_volume',
                         side_effect=lambda ctxt, vid: list(self.snapshots))
        test.mock_object(move, 'lock', side_effect=self._lock)
        test.mock_object(objects.VolumeAttachmentList,
                         'get_all_by_volume_id',
                         side_effect=lambda ctxt, vid:
                         self.volume(vid).volume_attachment)
        #: attachments of other volumes (dicts as in ``attachments``),
        #: which VolumeAttachmentList.get_all_by_host lists too.
        self.other_attachments = []
        test.mock_object(objects.VolumeAttachmentList, 'get_all_by_host',
                         side_effect=self._attachments_by_host)
        self.db.volumes[VOLUME_ID] = {
            'host': self.a.host, 'size': 1,
            'availability_zone': self.a.az, 'provider_location': None,
            'provider_auth': None}
        self.a.vg.add(LV, '1g')
        if thin:
            self.a.pool.add(LV, mapped)
        test.mock_object(move, 'pool_lock', side_effect=lambda *names:
                         FakeLock(self, 'dmclone-metasnap-%s-%s' % names))
        self.a.ensure_handle()

    # -- plumbing ----------------------------------------------------------

    def violation(self, text):
        self.violations.append(text)

    def _lock(self, volume_id):
        if self.lock_error is not None:
            raise self.lock_error
        return FakeLock(self, 'dmclone-%s' % volume_id)

    def _attachments_by_host(self, ctxt, host, search_opts=None):
        """The attachments on ``host`` not detached, of every volume."""
        return objects.VolumeAttachmentList(objects=[
            objects.VolumeAttachment(
                id=a['id'], volume_id=a.get('volume_id', self.volume_id),
                instance_uuid=a['instance_uuid'],
                attach_status=a['attach_status'],
                attached_host=a['attached_host'], connector=a['connector'])
            for a in self.attachments + self.other_attachments
            if a['attached_host'] == host and a['attach_status']
            != fields.VolumeAttachStatus.DETACHED])

    def _service(self, ctxt, host, binary):
        node = self.nodes.get(host.partition('@')[0])
        if node is None or not node.has_service:
            raise exception.ServiceNotFound(service_id=host)
        return FakeService(node)

    def source_regions(self, region_sectors):
        """Regions of the volume that hold data on node-a's thin LV."""
        pool = self.a.pool
        if pool is None:
            return set(range(dmsetup.region_count(SECTORS,
                                                  region_sectors)))
        regions = set()
        for first, end in pool.mapped.get(LV, ()):
            start = first * pool.block_sectors
            stop = min(end * pool.block_sectors, SECTORS)
            regions.update(range(start // region_sectors,
                                 -(-stop // region_sectors)))
        return regions

    def node_of(self, host):
        return self.nodes[volume_utils.extract_host(host, 'host')]

    def owner(self):
        return self.node_of(self.db.volumes[self.volume_id]['host'])

    def restart(self, node):
        if self.reboot:
            node.reboot()
        else:
            node.restart()
        node.recover()
        if self.owner() is node:
            node.ensure_export()

    def call(self, node, fn, *args):
        """An RPC call (or a REST call through cinder-api) to ``node``."""
        if node.down:
            raise oslo_messaging.MessagingTimeout('%s is down' % node.name)
        try:
            return fn(*args)
        except Crash:
            node.down = True
            if self.restart_before_timeout:
                self.restart(node)
            raise oslo_messaging.MessagingTimeout('%s died' % node.name)
        except Exception as exc:
            raise exception.VolumeBackendAPIException(data=str(exc))

    def resolve(self, props):
        """Log in from a node: the export must exist and allow us."""
        for node in self.nodes.values():
            if props['target_portal'] == '%s:3260' % node.target.ip:
                export = node.target.exports.get(props['target_iqn'])
                if export is None:
                    raise exception.VolumeBackendAPIException(
                        data='no such target %s' % props['target_iqn'])
                return node.dm.device_sectors(LV_PATH)
        raise exception.VolumeBackendAPIException(data='no portal')

    def _volumes_by_host(self, ctxt, host):
        return [self.volume(vid)
                for vid, rec in sorted(self.db.volumes.items())
                if rec['host'] == host]

    def _volumes_by_metadata(self, ctxt, filters):
        """VolumeList.get_all with a ``metadata`` filter (admin or user).

        Or with a column's value (``_name_id``), as Cinder's filters.
        """
        filters = dict(filters)
        wanted = filters.pop('metadata', {}).items()
        return [self.volume(vid) for vid in sorted(self.db.volumes)
                if wanted <= self.db.admin_metadata.get(vid, {}).items()
                and all(self.db.volumes[vid].get(key) == value
                        for key, value in filters.items())]

    def give_name_id(self, new_id=fake.VOLUME2_ID):
        """The volume gets id ``new_id``; its LV keeps its name.

        As Cinder's generic migration of an in-use volume leaves it: the
        LV keeps the name of the temporary volume, whose id the
        volume's ``_name_id`` holds (``volume.name`` is still ``LV``),
        and that temporary volume is deleted.  Returns ``new_id``.
        """
        old = self.volume_id
        rec = self.db.volumes.pop(old)
        rec['_name_id'] = old
        self.db.volumes[new_id] = rec
        if old in self.db.admin_metadata:
            self.db.admin_metadata[new_id] = self.db.admin_metadata.pop(old)
        self.volume_id = new_id
        return new_id

    def volume(self, volume_id=None):
        """A fresh Volume object from the database, as a manager loads."""
        volume_id = volume_id or self.volume_id
        rec = self.db.volumes.get(volume_id)
        if rec is None:
            raise exception.VolumeNotFound(volume_id=volume_id)
        md = self.db.admin_metadata.get(volume_id, {})
        volume = fake_volume.fake_volume_obj(
            self.ctxt, id=volume_id, host=rec['host'], size=rec['size'],
            availability_zone=rec['availability_zone'],
            provider_location=rec['provider_location'],
            provider_auth=rec['provider_auth'],
            _name_id=rec.get('_name_id'),
            status=rec.get('status', 'available'),
            previous_status=rec.get('previous_status'),
            multiattach=self.multiattach,
            volume_admin_metadata=[{'key': k, 'value': v}
                                   for k, v in md.items()])
        volume.volume_attachment = objects.VolumeAttachmentList(objects=[
            objects.VolumeAttachment(
                id=a['id'], volume_id=volume_id,
                instance_uuid=a['instance_uuid'],
                attach_status=a['attach_status'],
                attached_host=a['attached_host'], connector=a['connector'])
            for a in self.attachments])
        volume.obj_reset_changes()
        return volume

    def crash_at(self, obj, attr, when='before', match=None):
        """Make ``obj.attr`` kill its service once, before or after it ran.

        ``match(*args, **kwargs)`` picks the call; returns a dict whose
        ``fired`` tells whether the crash happened.
        """
        original = getattr(obj, attr)
        record = {'fired': False}

        def crashing(*args, **kwargs):
            if not record['fired'] and (match is None
                                        or match(*args, **kwargs)):
                record['fired'] = True
                if when == 'after':
                    original(*args, **kwargs)
                raise Crash('%s %s' % (when, attr))
            return original(*args, **kwargs)
        self.test.mock_object(obj, attr, side_effect=crashing)
        return record

    def transfer(self):
        return move.Move.from_metadata(
            self.volume_id, self.db.admin_metadata.get(self.volume_id))

    def set_state(self, t, state):
        """Put the recorded transfer in ``state`` (a test's arrangement)."""
        self.db.volume_admin_metadata_update(
            self.ctxt, self.volume_id, {'dmclone_state': state}, False)
        t.state = state

    # -- what Nova does ----------------------------------------------------

    def attach(self, node, instance_uuid=fake.INSTANCE_ID):
        """Attach on ``node``; returns (attachment, connection info).

        Cinder 29's ``attachment_create`` with a connector (what Nova's
        live migration calls; volume/api.py): ``_attachment_reserve``
        reserves the attachment (and turns an available volume
        ``reserved``), then the manager's attachment_update asks the
        driver.  If that fails the API raises and the attachment stays
        ``reserved``, with no host and no connector, and the volume
        ``reserved``: nothing deletes it (its caller never learnt its
        id).  Detach it with :meth:`detach` (``attachment-delete``).
        """
        att = {'id': next(self._ids), 'instance_uuid': instance_uuid,
               'attach_status': fields.VolumeAttachStatus.RESERVED,
               'attached_host': None, 'connector': None}
        self.attachments.append(att)
        rec = self.db.volumes[self.volume_id]
        owner = self.owner()
        try:
            info = self.call(owner, owner.attach, self.volume(),
                             dict(node.props))
        except Exception:
            if rec.get('status', 'available') in ('available',
                                                  'downloading'):
                rec['status'] = 'reserved'
            raise
        att.update(attach_status=fields.VolumeAttachStatus.ATTACHED,
                   attached_host=node.name, connector=dict(node.props))
        return att, info

    def withdraw_attach_during_build(self):
        """Nova deletes the attachment it reserved while node-b builds.

        (Its attach call timed out, and it gave up.)
        """
        build = self.b.dest.build_clone

        def build_then_withdraw(*args, **kwargs):
            path = build(*args, **kwargs)
            self.attachments[:] = [
                a for a in self.attachments if a['attach_status']
                != fields.VolumeAttachStatus.RESERVED]
            return path
        self.test.mock_object(self.b.dest, 'build_clone',
                              side_effect=build_then_withdraw)

    def migrate(self, node, host=None, lock_volume=False):
        """An admin's ``cinder migrate`` of the volume to node's pool.

        Cinder's manager on the volume's node (manager_flow.migrate_volume)
        asks its driver; ``host`` replaces the scheduler's host of ``node``.
        Returns whether the driver moved it (False: Cinder's generic copy,
        not modelled).  As Cinder 29's API (volume/api.py migrate_volume)
        the status is kept as ``previous_status``, and ``lock_volume``
        turns an available volume ``maintenance``.  A status a test set
        to ``maintenance`` or ``retyping`` (the API's of a locked
        migration, of a retype) stands, with ``available`` before it.
        """
        rec = self.db.volumes[self.volume_id]
        status = rec.get('status', 'available')
        if status in ('maintenance', 'retyping'):
            rec.setdefault('previous_status', 'available')
        else:
            rec['previous_status'] = status
            if lock_volume and status == 'available':
                rec['status'] = 'maintenance'
        owner = self.owner()
        return self.call(owner, manager_flow.migrate_volume, owner,
                         self.ctxt, self.volume(),
                         host or node.scheduler_host(), owner._save, node.az)

    def detach(self, att):
        """``attachment-delete``: Cinder 29's manager.attachment_delete.

        One with no connector (reserved, never connected: see attach)
        asks no driver (_connection_terminate exits early); the volume
        with no attachment left is available again.
        """
        if att['connector'] is not None:
            owner = self.owner()
            self.call(owner, owner.attachment_delete, self.volume(),
                      att['connector'])
        self.attachments.remove(att)
        rec = self.db.volumes[self.volume_id]
        if not self.attachments and rec.get('status') == 'reserved':
            rec['status'] = 'available'

    def delete(self):
        """The user deletes the volume (Cinder routes it to its host).

        As Cinder's API and volume manager: the volume is ``deleting``
        while its node deletes it, ``error_deleting`` if that fails.
        """
        owner = self.owner()
        rec = self.db.volumes[self.volume_id]
        rec['status'] = 'deleting'
        try:
            self.call(owner, owner.delete_volume, self.volume())
        except Exception:
            rec['status'] = 'error_deleting'
            raise
        self.deleted = True

    def tick(self, node):
        """Let every clone with hydration on copy, then a monitor tick.

        Half a peer's rest passes per tick (Destination.PEER_REST).
        """
        self.now += 30
        for name in list(node.dm.devices):
            if node.dm._clone(name) is not None:
                node.dm.hydrate(name)
        node.monitor.tick()

    def settle(self, ticks=4):
        for _ in range(ticks):
            for node in self.nodes.values():
                if node.down:
                    continue
                try:
                    self.tick(node)
                except Crash:
                    self.restart(node)

    # -- checks ------------------------------------------------------------

    def transfer_keys(self):
        return {k: v for k, v in self.db.admin_metadata.get(
            self.volume_id, {}).items() if k.startswith(move.KEY_PREFIX)}

    def assert_no_transfer(self, aborted_ok=False):
        """No transfer: no state key.

        (Other keys left by a crash part-way through Store.clear are inert.)
        With ``aborted_ok``, an ``aborted`` state may remain: a destination
        that died before it built anything has nothing its recovery can
        find, and an aborted transfer is inert (never seen as moving).
        """
        keys = self.transfer_keys()
        if aborted_ok and keys.get('dmclone_state') == move.ABORTED:
            self.test.assertIsNone(self.a.source.load(self.volume_id))
            return
        self.test.assertNotIn('dmclone_state', keys)
        self.test.assertIsNone(self.transfer())

    def assert_no_snapshot_held(self):
        """No metadata snapshot is held, and no record of one remains."""
        for node in self.nodes.values():
            if node.pool is not None:
                self.test.assertFalse(node.pool.held, node.name)
            self.test.assertEqual([], node.thin_maps().recorded_pools(),
                                  node.name)

    def assert_rolled_back(self, aborted_ok=False):
        t = self.test
        t.assertEqual([], self.violations)
        self.assert_no_snapshot_held()
        self.assert_no_transfer(aborted_ok)
        t.assertEqual(self.a.host, self.db.volumes[self.volume_id]['host'])
        t.assertEqual(self.a.az,
                      self.db.volumes[self.volume_id]['availability_zone'])
        t.assertEqual({}, self.b.vg.lvs)
        t.assertEqual({}, self.b.dm.devices)
        t.assertEqual({}, self.b.connector.sessions)
        t.assertEqual([LV], list(self.a.vg.lvs))
        t.assertTrue(self.a.vg.lvs[LV]['complete'])
        t.assertEqual([HANDLE], list(self.a.dm.devices))
        acl = self.a.target.exports.get(FakeTargetIQN, {}).get('acl', ())
        t.assertNotIn(self.b.props['initiator'], acl)

    def assert_deleted(self):
        t = self.test
        t.assertEqual([], self.violations)
        self.assert_no_transfer()
        for node in self.nodes.values():
            t.assertEqual({}, node.vg.lvs, node.name)
            t.assertEqual({}, node.dm.devices, node.name)
            t.assertEqual({}, node.connector.sessions, node.name)
            t.assertEqual({}, node.target.exports, node.name)

    def assert_completed(self):
        t = self.test
        t.assertEqual([], self.violations)
        self.assert_no_snapshot_held()
        self.assert_no_transfer()
        t.assertEqual(self.b.host, self.db.volumes[self.volume_id]['host'])
        t.assertEqual(self.b.az,
                      self.db.volumes[self.volume_id]['availability_zone'])
        t.assertIsNone(self.db.volumes[self.volume_id]['provider_location'])
        t.assertEqual([LV], list(self.b.vg.lvs))
        t.assertTrue(self.b.vg.lvs[LV]['complete'])
        t.assertEqual({HANDLE: [dmsetup.linear_segment(0, SECTORS,
                                                       LV_PATH)]},
                      self.b.dm.devices)
        t.assertEqual({}, self.b.connector.sessions)
        t.assertEqual({}, self.a.vg.lvs)
        t.assertEqual({}, self.a.dm.devices)
        t.assertEqual({}, self.a.target.exports)
        t.assertEqual(set(), self.b.destination.pending_finalize)
        # The source's old copy was wiped before its extents were freed.
        t.assertTrue(any('/%s-dmcwipe-' % LV in p for p in self.a.wiped),
                     str(self.a.wiped))


FakeTargetIQN = 'iqn.2010-10.org.openstack:%s' % LV


class FakeService(object):
    """The fields of objects.Service the source reads."""

    def __init__(self, node):
        self.disabled = node.disabled
        self.is_up = node.service_up
        self.availability_zone = node.az
