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

"""Cinder volume driver for node-local LVM volumes that move between nodes.

Every compute node runs a cinder-volume service with this driver over its
own volume group.  On its own node a volume behaves like one of Cinder's LVM
volumes, with one difference: it is always reached through a stable
device-mapper *handle* (see :mod:`cinder_dmclone.layout`), never through the
LV directly, so that the mapping under the handle can later become a
``clone`` target while the volume moves to another node, without the path
an instance uses ever changing.

This module holds Cinder semantics only; device-mapper's formats are in
:mod:`cinder_dmclone.dmsetup`, and the commands the driver runs as root
itself (beyond Cinder's LVM helper and os-brick) in
:mod:`cinder_dmclone.privileged`.
"""

import ipaddress
import os

from oslo_concurrency import processutils
from oslo_config import cfg
from oslo_log import log as logging
from oslo_utils import excutils
from oslo_utils import units

from cinder.brick.local_dev import lvm as brick_lvm
from cinder import context as cinder_context
from cinder import exception
from cinder.i18n import _
from cinder.image import image_utils
from cinder import interface
from cinder.message import api as message_api
from cinder.message import message_field
from cinder import objects
from cinder import utils
from cinder.volume import volume_utils

# Cinder's LVM driver annotates with cinder.objects types at import time;
# the volume service registers them first, a bare import must do it too.
objects.register_all()

from cinder.volume.drivers import lvm  # noqa: E402

from cinder_dmclone import clone  # noqa: E402
from cinder_dmclone import dmsetup  # noqa: E402
from cinder_dmclone import evidence  # noqa: E402
from cinder_dmclone import exception as dmc_exception  # noqa: E402
from cinder_dmclone import layout  # noqa: E402
from cinder_dmclone import map_mark  # noqa: E402
from cinder_dmclone import move  # noqa: E402
from cinder_dmclone import opts  # noqa: E402
from cinder_dmclone import peer  # noqa: E402
from cinder_dmclone import privileged  # noqa: E402
from cinder_dmclone import recovery  # noqa: E402
from cinder_dmclone import region_map  # noqa: E402
from cinder_dmclone import service  # noqa: E402
from cinder_dmclone import thin  # noqa: E402
from cinder_dmclone import wiper  # noqa: E402

LOG = logging.getLogger(__name__)
CONF = cfg.CONF


def _same_address(portal_address, configured):
    """Do a portal's address and a configured address name one host?

    IP addresses compare by value (``fd00:0::1`` is ``[fd00::1]``), host
    names without regard to case.
    """
    portal_address = portal_address.strip()
    if portal_address.startswith('[') and portal_address.endswith(']'):
        portal_address = portal_address[1:-1]
    configured = (configured or '').strip()
    try:
        return (ipaddress.ip_address(portal_address)
                == ipaddress.ip_address(configured))
    except ValueError:
        return portal_address.lower() == configured.lower()


@interface.volumedriver
class DMCloneVolumeDriver(lvm.LVMVolumeDriver):
    """Node-local LVM volumes behind device-mapper handles.

    Version history:

    .. code-block:: none

        1.0.0 - Node-local lifecycle behind device-mapper handles.
        1.1.0 - Volumes move to the node that attaches them (transfers).
        1.2.0 - Node-to-node steps carry the move's secret; old copies are
                wiped; cinder migrate of a detached volume is a move.
    """

    VERSION = '1.2.0'
    CI_WIKI_NAME = 'cinder-dmclone_CI'

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.configuration.append_config_values(opts.dmclone_opts)
        # Cinder's LVM driver identifies the node by socket.gethostname();
        # the service's configured host is the identity that Nova's
        # connectors and the other nodes' services agree on.
        self.hostname = self.node_name
        self.backend_name = (self.configuration.volume_backend_name
                             or 'DMClone')
        self.dm = privileged.DMSetup(execute=self._execute,
                                     root_helper=utils.get_root_helper())
        self.metadata_vg = None
        self.monitor = None
        self.store = move.Store(self.db)
        self.peer = peer.PeerClient(
            timeout=self.configuration.dmclone_transfer_timeout,
            node_name=self.node_name)
        self._moves = None
        self._wiper = None
        self._exported_handles_ready = False

    @classmethod
    def get_driver_options(cls):
        return super().get_driver_options() + opts.dmclone_opts

    # ------------------------------------------------------------------
    # Identity
    # ------------------------------------------------------------------

    @property
    def node_name(self):
        """The name connectors use for this node (see dmclone_node_name)."""
        configured = self.configuration.dmclone_node_name
        if configured:
            return configured
        return volume_utils.extract_host(self.host or CONF.host, 'host')

    def _node_names(self):
        aliases = self.configuration.dmclone_node_aliases or []
        return {self.node_name} | set(aliases)

    def _is_local_connector(self, connector):
        """True if the connector is a host on this very node."""
        return bool(connector) and connector.get('host') in self._node_names()

    @staticmethod
    def _require_host(connector):
        """Refuse a connector that does not name its node.

        Whether an attach is local, an iSCSI export or a move depends on
        the connector's ``host``: without it there is no right answer.
        (A detach needs none: a force detach has no connector at all.)
        """
        if not connector or not connector.get('host'):
            raise exception.InvalidConnectorException(missing='host')

    # ------------------------------------------------------------------
    # Setup
    # ------------------------------------------------------------------

    def do_setup(self, context):
        self._check_coordination()
        super().do_setup(context)
        self._region_sectors()

    def check_for_setup_error(self):
        """Refuse to start on a configuration that cannot work.

        Checked here so an operator sees one clear message at service start
        instead of a failure at the first transfer: the region size, the
        target helper (LIO), the volume group (Cinder's own checks), the
        metadata volume group, device-mapper with the ``clone`` target, and
        a coordination backend shared by the nodes.
        """
        self._check_coordination()
        self._region_sectors()
        self._check_target_helper()
        super().check_for_setup_error()
        self.metadata_vg = self._open_metadata_vg()
        self._check_device_mapper()
        self._recover_transfers()
        self._thin_maps().release_leftovers()
        self.wiper.resume()
        self._start_monitor()

    def _check_coordination(self):
        """Refuse a coordination backend whose locks are per node.

        (:func:`cinder_dmclone.move.check_coordination`.)
        """
        move.check_coordination(CONF.coordination.backend_url,
                                self.configuration.dmclone_shared_file_locks)

    def _region_sectors(self):
        size_kb = self.configuration.dmclone_region_size
        try:
            return layout.region_sectors(size_kb)
        except dmc_exception.InvalidTable:
            raise exception.InvalidConfigurationValue(
                option='dmclone_region_size', value=size_kb) from None

    #: Target helpers this driver works with: LIO (Cinder's test double
    #: ``fake`` aside).  A move commits only once the source's handle has
    #: no opener but LIO's backstore, which the kernel's configfs names;
    #: tgtd, a user-space opener, would hold every move in ``cloned``.
    TARGET_HELPERS = ('lioadm', 'fake')

    def _check_target_helper(self):
        helper = self.configuration.target_helper
        if helper not in self.TARGET_HELPERS:
            raise exception.InvalidConfigurationValue(
                option='target_helper', value=helper)

    def _lvm_conf(self):
        conf = self.configuration.lvm_conf_file
        return None if conf.lower() == 'none' else conf

    def _metadata_vg_name(self):
        return (self.configuration.dmclone_metadata_volume_group
                or self.configuration.volume_group)

    def _open_metadata_vg(self):
        name = self._metadata_vg_name()
        if name == self.configuration.volume_group:
            return self.vg
        try:
            return brick_lvm.LVM(name, utils.get_root_helper(),
                                 lvm_type='default',
                                 executor=self._execute,
                                 lvm_conf=self._lvm_conf())
        except (exception.VolumeGroupNotFound,
                processutils.ProcessExecutionError) as exc:
            # (``vgs`` of a missing VG exits non-zero on recent LVM, which
            # brick passes on as a command error.)
            detail = getattr(exc, 'stderr', None) or ''
            raise exception.VolumeBackendAPIException(
                data=_('Metadata volume group %(vg)s '
                       '(dmclone_metadata_volume_group) does not exist. '
                       '%(detail)s') % {'vg': name,
                                        'detail': detail.strip()}) from None

    def _check_device_mapper(self):
        try:
            self.dm.version()
            targets = self.dm.targets()
            if 'clone' not in targets:
                self._load_clone_module()
                targets = self.dm.targets()
        except dmc_exception.DMSetupCommandFailed as exc:
            raise exception.VolumeBackendAPIException(
                data=_('device-mapper is not usable on this node (is dmsetup '
                       'installed and allowed by rootwrap?): %s') % exc) \
                from None
        if 'clone' not in targets:
            raise exception.VolumeBackendAPIException(
                data=_('The kernel of this node has no device-mapper "clone" '
                       'target (CONFIG_DM_CLONE, module dm_clone); loaded '
                       'targets: %s') % ', '.join(sorted(targets)))
        LOG.info('device-mapper clone target %s available.',
                 targets['clone'])

    def _load_clone_module(self):
        """Load dm_clone: ``dmsetup targets`` lists loaded targets only."""
        try:
            privileged.load_module('dm_clone', execute=self._execute,
                                   root_helper=utils.get_root_helper())
        except dmc_exception.CommandRefused as exc:
            LOG.error('Could not load the dm_clone kernel module: rootwrap '
                      'refused modprobe; install the dmclone.filters of '
                      'this release. %s', exc)
        except dmc_exception.KernelModuleNotFound as exc:
            LOG.warning('The running kernel has no dm_clone module: %s', exc)
        except dmc_exception.PrivilegedCommandFailed as exc:
            LOG.warning('Could not load the dm_clone kernel module: %s', exc)

    def _start_monitor(self):
        if self.monitor is None:
            self.monitor = self.moves.monitor
            self.monitor.start()

    # ------------------------------------------------------------------
    # Moves: this node's source and destination sides
    # ------------------------------------------------------------------

    @property
    def moves(self):
        """This node's :class:`~cinder_dmclone.service.MoveService`."""
        if self._moves is None:
            conf = self.configuration
            self._moves = service.MoveService(
                node_names=self._node_names(), node_name=self.node_name,
                store=self.store, peer_client=self.peer,
                clones=self._clones(), target_driver=self.target_driver,
                dm=self.dm, volume_group=conf.volume_group,
                wiper=self.wiper, region_sectors=self._region_sectors(),
                tuning=(conf.dmclone_hydration_threshold,
                        conf.dmclone_hydration_batch_size),
                interval=conf.dmclone_monitor_interval,
                stall_timeout=conf.dmclone_stall_timeout,
                ensure_export=self._ensure_export_moving_away,
                service_host=volume_utils.extract_host(
                    self.host or CONF.host, 'host'),
                thin_maps=(self._thin_maps()
                           if conf.dmclone_thin_map else None),
                map_marks=map_mark.MapMarks(
                    map_mark.marks_dir(self._state_dir(),
                                       self.node_name)),
                end_marks=map_mark.MapMarks(
                    map_mark.marks_dir(self._state_dir(), self.node_name,
                                       map_mark.ENDING)),
                part_marks=map_mark.MapMarks(
                    map_mark.marks_dir(self._state_dir(), self.node_name,
                                       map_mark.MOVING),
                    read_limit=evidence.READ_LIMIT))
        return self._moves

    @staticmethod
    def _state_dir():
        """This service's own files: ``<state_path>/dmclone``."""
        return os.path.join(CONF.state_path, 'dmclone')

    def _thin_maps(self):
        """What reads the map of a thin LV here (dmclone_thin_map).

        Its records of held metadata snapshots live under
        ``<state_path>/dmclone``; a start releases those left held
        whether or not the option is still on.
        """
        return region_map.ThinMaps(
            self.node_name, self.configuration.volume_group,
            self._state_dir(), execute=self._execute,
            root_helper=utils.get_root_helper(),
            stream=privileged.stream_output,
            max_mappings=self.configuration.dmclone_thin_map_max_mappings)

    @property
    def source(self):
        return self.moves.source

    @property
    def destination(self):
        return self.moves.destination

    def _clones(self):
        connector = volume_utils.brick_get_connector(
            'ISCSI', use_multipath=False,
            device_scan_attempts=(
                self.configuration.num_volume_device_scan_tries))
        return clone.Clones(
            self.dm, self.vg, self.metadata_vg or self.vg, connector,
            self._execute, utils.get_root_helper(),
            lvm_type=self.configuration.lvm_type,
            metadata_reserve=self.configuration.dmclone_metadata_reserve,
            discard=self.wiper.discard,
            thin_pool=self._thin_pool_name(),
            max_over_subscription_ratio=(
                self.configuration.max_over_subscription_ratio),
            reserved_percentage=self.configuration.reserved_percentage,
            thin_map=self.configuration.dmclone_thin_map)

    def _thin_pool_name(self):
        """The thin pool of ``lvm_type = thin``, named as Cinder's driver."""
        return '%s-pool' % self.configuration.volume_group

    @property
    def wiper(self):
        """Removes old copies, wiped, in the background."""
        if self._wiper is None:
            self._wiper = wiper.Wiper(
                self.vg, self.dm,
                wipe=self._wipe if self._needs_wipe() else None,
                lv_names=self._data_lv_names)
        return self._wiper

    def _data_lv_names(self):
        """The data group's LVs as LVM lists them (LVMUnlisted if not)."""
        return self.moves.destination.clones.lv_names(self.vg.vg_name)

    def _volume_not_present(self, volume_name):
        """True if LVM's own listing of the data group lacks the LV.

        Cinder's LVM driver asks brick, which reads 'Volume group "X" not
        found' (a PV not scanned yet after a reboot) as "no such LV": a
        delete of a volume or a snapshot then returned at once, Cinder
        destroyed the record, and the tenant's LV stayed, never wiped
        and described by nothing.  Here the delete fails instead
        (LVMUnlisted, nothing removed) and may be asked again once LVM
        lists the group.
        """
        return volume_name not in self._data_lv_names()

    def _needs_wipe(self):
        return (self.configuration.volume_clear != 'none'
                and self.configuration.lvm_type != 'thin')

    def _wipe(self, path, size_mb):
        """Clear an LV that held volume data before it is removed.

        As Cinder's LVM driver does on delete (``volume_clear``,
        ``volume_clear_size``): the extents of a thick LV go to the next
        LV created in the group, another tenant's perhaps.  Thin LVs need
        nothing: the pool hands out zeroed blocks.
        """
        if not self._needs_wipe():
            return
        volume_utils.clear_volume(
            size_mb, path, volume_clear=self.configuration.volume_clear,
            volume_clear_size=self.configuration.volume_clear_size,
            volume_clear_ionice=self.configuration.volume_clear_ionice)

    def _recover_transfers(self):
        """Resume moves into or out of this node after a restart."""
        if self.db is None:
            return
        ctxt = cinder_context.get_admin_context()
        volumes = recovery.volumes_touching(ctxt, self.host,
                                            self._node_names())
        meta_lvs = [lv['name'] for lv in self.metadata_vg.get_volumes()
                    if layout.lv_name_from_metadata_lv(lv['name'])]
        self.moves.recovery.recover(volumes, meta_lvs)
        lv_names = [lv['name'] for lv in self.vg.get_volumes()]
        self.moves.recovery.report_lost_copies(
            recovery.volumes_with_old_copies(
                ctxt, self._node_names(), lv_names, volumes))
        try:
            self.moves.recovery.report_lvs_of_deleted_volumes(
                recovery.lvs_of_deleted_volumes(ctxt, lv_names, volumes))
        except Exception:
            LOG.warning('Could not look for old copies of deleted volumes.',
                        exc_info=True)

    # ------------------------------------------------------------------
    # Handles
    # ------------------------------------------------------------------

    def handle_path(self, volume):
        """The stable device path of a volume on this node."""
        return layout.handle_path(self.configuration.volume_group,
                                  volume['name'])

    def _lv_path(self, lv_name):
        return layout.lv_device(self.configuration.volume_group, lv_name)

    def _linear_table(self, lv_name):
        device = self._lv_path(lv_name)
        return [dmsetup.linear_segment(0, self.dm.device_sectors(device),
                                       device)]

    def _ensure_handle(self, volume, serving=None):
        """Make sure the volume's handle exists and covers the whole LV.

        Idempotent: after a node reboot handles are gone (device-mapper
        state is not persistent) and are rebuilt here; a linear handle whose
        length no longer matches its LV (extended while the service was
        down) is reloaded.  A handle with any other table is a transfer's
        and is left alone.

        ``serving`` (what the caller does with it, for the error) is given
        by the requests that serve the volume from here, which Cinder
        routes by a read of the record that may predate a rollback: with
        no move recorded, a missing handle is then made only if the record
        read now names this node (Side.refuse_unless_here).  Not by those
        that run while the record names another node on purpose: Cinder's
        generic migration renames the LV here (update_migrated_volume)
        before it swaps the records.

        A request that serves the volume maps the handle under this
        node's handle lock (:func:`move.handle_lock`), which a revert
        holds from the handle's removal to its making again
        (:meth:`revert_to_snapshot`): the handle never opens the LV
        between the revert's check that nothing holds it open and its
        merge.  Not the coordination lock: a local attach must not need
        the coordination backend.
        """
        if serving:
            with move.handle_lock(volume['id']):
                return self._map_handle(volume, serving)
        return self._map_handle(volume)

    def _map_handle(self, volume, serving=None):
        """:meth:`_ensure_handle`'s work, under the lock if it serves."""
        lv_name = volume['name']
        name = self._handle_name(lv_name)
        self.vg.activate_lv(lv_name)
        table = self._linear_table(lv_name)
        if not self.dm.exists(name):
            self._refuse_linear_over_clone(volume, serving)
            try:
                self.dm.create(name, table,
                               uuid=layout.handle_uuid(
                                   self.configuration.volume_group, lv_name))
                LOG.debug('Created handle %s for %s.', name, volume['id'])
            except dmc_exception.DMSetupCommandFailed:
                # Someone else may have created it in between.
                if not self.dm.exists(name):
                    raise
        else:
            self._refresh_handle(volume, table)
        return layout.handle_path(self.configuration.volume_group, lv_name)

    def _handle_name(self, lv_name):
        return layout.handle_name(self.configuration.volume_group, lv_name)

    def _refuse_linear_over_clone(self, volume, serving=None):
        """Never map a partly hydrated LV alone.

        A metadata LV here, or a transfer into this node in any state but
        those where its LV is known whole (move.WHOLE_AT_DEST: hydration
        complete; ``source_lost`` is not, its abandon zeroes what was
        never copied only at its end), means the volume is moving in and
        its LV may hold only the regions copied so far: only the clone
        may serve it, and startup recovery (or the abandon) rebuilds that.
        The recorded state counts even when the metadata LV is gone.  The
        metadata LV is read from LVM's own listing: a metadata group LVM
        cannot list (a PV scanned late after a reboot) refuses too
        (Destination.metadata_here).  With no move recorded and
        ``serving``, the volume record read now must name this node
        (Side.refuse_unless_here).
        """
        lv_name = volume['name']
        t = self.destination.load(volume['id'])
        moving_in = self.destination.is_dest(t) and \
            t.state not in move.WHOLE_AT_DEST
        if t is None and serving:
            # An LV here named like a volume that lives elsewhere (kept by
            # a rollback, which a request routed by an older read of the
            # record may follow) is no copy to serve.
            self.destination.refuse_unless_here(volume, serving)
        if volume['id'] in self.moves.recovery.pending_rebuild:
            raise exception.VolumeBackendAPIException(
                data=_('Volume %s is moving into this node and its clone '
                       'waits for its source node to answer again (or for '
                       'LVM to list the volume groups here); the volume '
                       'service rebuilds it then.') % volume['id'])
        if moving_in and t.state == move.SOURCE_LOST:
            raise exception.VolumeBackendAPIException(
                data=_('Volume %s: the abandon of its lost source did not '
                       'finish, and its LV here holds only the regions '
                       'copied so far; run "cinder-dmclone move '
                       'abandon-source %s" on this node again.')
                % (volume['id'], volume['id']))
        if moving_in or self.destination.metadata_here(volume):
            raise exception.VolumeBackendAPIException(
                data=_('Volume LV %s is being hydrated by a transfer but has '
                       'no clone target; restart the volume service to '
                       'rebuild it.') % lv_name)

    def _refresh_handle(self, volume, table=None):
        """Reload a linear handle whose length differs from its LV's."""
        name = self._handle_name(volume['name'])
        current = self.dm.table(name)
        if any(seg.target != 'linear' for seg in current):
            return
        table = table or self._linear_table(volume['name'])
        if dmsetup.table_length(current) != dmsetup.table_length(table):
            self.dm.reload(name, table)
            LOG.info('Handle of volume %(id)s resized to %(len)d sectors.',
                     {'id': volume['id'],
                      'len': dmsetup.table_length(table)})

    def _remove_handle(self, lv_name):
        self.dm.remove(self._handle_name(lv_name))

    # ------------------------------------------------------------------
    # Volume lifecycle
    # ------------------------------------------------------------------

    def create_volume(self, volume):
        super().create_volume(volume)
        self._handle_or_rollback(volume)

    def _handle_or_rollback(self, volume):
        """Create the handle of a new volume, deleting the LV on failure."""
        try:
            self._ensure_handle(volume)
        except Exception:
            LOG.error('Could not create the handle of volume %s; deleting '
                      'its logical volume.', volume['id'])
            self._remove_handle(volume['name'])
            self.wiper.discard(volume['name'])
            raise

    def create_snapshot(self, snapshot):
        if not isinstance(snapshot, dict):
            # (a dict is the LVM driver's own temporary snapshot of a clone)
            self._refuse_reading_elsewhere(snapshot.volume, _('a snapshot'))
        super().create_snapshot(snapshot)

    def _refuse_reading_elsewhere(self, volume, action):
        """Refuse to read the volume's LV here unless it is the volume.

        A move refuses (MoveInProgress).  With none recorded, the volume
        record read now must name this node: Cinder routes the request
        by an older read, and an LV here named like a volume that lives
        elsewhere is no copy of it (kept by a rollback, see
        Side.refuse_unless_here).
        """
        self.source.refuse_if_moving(volume, action)
        self.source.refuse_unless_here(volume, action)

    def create_volume_from_snapshot(self, volume, snapshot):
        super().create_volume_from_snapshot(volume, snapshot)
        self._handle_or_rollback(volume)

    def create_cloned_volume(self, volume, src_vref):
        self._refuse_reading_elsewhere(src_vref, _('cloning it'))
        super().create_cloned_volume(volume, src_vref)
        self._handle_or_rollback(volume)

    def delete_volume(self, volume):
        """Remove the handle, then the LV (the handle holds the LV open).

        Refused, with nothing removed, when the volume record (read now)
        names another node and is not ``creating``
        (Side.refuse_delete_unless_here).  Known limitation: Cinder's
        create flow deletes a failed create's volume here only after it
        rescheduled it (create_volume.py ``_post_reschedule``, which
        ignores the error); if the rescheduled create is already
        ``available`` on another node, its half-made LV stays here.  The
        manage listing shows it ("named like another volume"); the
        start-up report does not while the volume exists (see
        doc/source/limitations.rst).  This node's mark of a move of the
        volume goes with it (:mod:`~cinder_dmclone.evidence`): no move of
        a deleted volume survives.
        """
        lv_name = layout.validate_lv_name(volume['name'])
        if self.destination.delete(volume):
            LOG.info('Deleted volume %s and its transfer.', volume['id'])
            return
        self.source.give_up_aborted(volume)
        if self._volume_not_present(lv_name):
            self._remove_handle(lv_name)
            self.source.end_every_part(volume['id'])
            return
        if self.vg.lv_has_snapshot(lv_name):
            LOG.error('Unable to delete due to existing snapshot '
                      'for volume: %s', lv_name)
            raise exception.VolumeIsBusy(volume_name=lv_name)
        self._remove_handle(lv_name)
        self._delete_volume(volume)
        self.source.end_every_part(volume['id'])
        LOG.info('Successfully deleted volume: %s', volume['id'])

    def extend_volume(self, volume, new_size):
        """Extend the LV, then the handle's table, online.

        The handle is reloaded to the new length (suspend/load/resume keeps
        in-flight I/O), so an attached instance sees the new size.  The
        LV grows under the volume's lock, with the check that no move
        forbids it (:meth:`Destination.extend
        <cinder_dmclone.destination.Destination.extend>`).
        """
        if self.destination.extend(volume, lambda: self.vg.extend_volume(
                volume['name'], self._sizestr(new_size))):
            LOG.info('Volume %s extended during its transfer: the clone '
                     'keeps its length, the extension is mapped linearly.',
                     volume['id'])
        elif self.dm.exists(self._handle_name(volume['name'])):
            self._refresh_handle(volume)
        try:
            self.target_driver.extend_target(volume)
        except Exception:
            LOG.exception('Error extending target after volume resize.')
            raise exception.TargetUpdateFailed(volume_id=volume.id)

    def revert_to_snapshot(self, context, volume, snapshot):
        """Revert by merging the snapshot's LV into the volume's LV.

        LVM merges at once only an LV nobody holds open: the handle goes
        first and is made again whatever happens; if that fails too after
        a failed revert, the revert's error is the one raised.  Thick
        volumes take Cinder's own revert; thin ones
        :meth:`_revert_thin`, never Cinder's generic copy.  Cinder's API
        reverts only to the latest snapshot and only at the snapshot's
        size, so the LV and its snapshot have the same length.

        All of it under the volume's lock, so that a move, which holds
        it, is seen here, and this node's handle lock, so that a request
        that maps the handle (:meth:`_ensure_handle` serving the volume)
        waits.  A handle mapped
        between the check that nothing holds the LV open and the merge
        would have LVM defer the merge to the LV's next activation (a
        reboot's), which swaps the snapshot in under the writes made
        since.
        """
        with move.lock(volume['id']), move.handle_lock(volume['id']):
            self._revert_unmapped(context, volume, snapshot)

    def _revert_unmapped(self, context, volume, snapshot):
        """:meth:`revert_to_snapshot` under the lock: the handle goes."""
        self.source.refuse_if_moving(volume, _('a revert to a snapshot'))
        self._remove_handle(volume['name'])
        try:
            if self.configuration.lvm_type == 'thin':
                self._revert_thin(volume, snapshot)
            else:
                super().revert_to_snapshot(context, volume, snapshot)
        except Exception:
            with excutils.save_and_reraise_exception():
                try:
                    self._ensure_handle(volume)
                except Exception:
                    LOG.exception('Could not make the handle of volume %s '
                                  'again after its failed revert; the '
                                  'volume service makes it at its next '
                                  'start.', volume['id'])
        self._ensure_handle(volume)

    def _revert_thin(self, volume, snapshot):
        """Swap the thin snapshot in for the volume's thin LV.

        Not Cinder's generic revert: it copies a volume made from the
        snapshot onto this one with ``dd conv=sparse`` (a thin pool
        reports ``sparse_copy_volume``), which skips the blocks that read
        zero at the snapshot, so whatever was written there since
        survives the revert.

        With neither LV open, ``lvconvert --merge`` of a thin snapshot
        swaps the snapshot's thin device in under the volume's LV name
        in one metadata commit and removes the old one: the LV reads
        either as before or as the snapshot, never a mix.  The merged LV
        takes the origin's attributes (no activation-skip flag); the
        volume's other snapshots are thin devices of their own,
        untouched.  Were one of them open, LVM defers the merge to the
        LV's next activation, which the deactivation and activation that
        follow (Cinder's thick sequence) bring about; the merge is then
        checked done (the snapshot's LV gone) before the snapshot, which
        the merge consumed, is made again under its name.
        """
        lv_name = volume.name
        snap_lv = self._escape_snapshot(snapshot.name)
        # Held open (by anything but the handle, gone now), the merge
        # would be deferred to an activation nobody asked for: a reboot
        # would then swap the snapshot in under writes made since.
        held = [name for name in (lv_name, snap_lv)
                if self.vg.lv_is_open(name)]
        if held:
            raise exception.VolumeBackendAPIException(data=_(
                'Cannot revert volume %(vol)s: LV %(held)s is held open '
                'by something other than this driver (dmsetup info -c, '
                'lsof); nothing was changed.') % {
                    'vol': volume.id, 'held': ', '.join(held)})
        self.vg.revert(snap_lv)
        self.vg.deactivate_lv(lv_name)
        self.vg.activate_lv(lv_name)
        if self._lv_listed(snap_lv):
            raise exception.VolumeBackendAPIException(data=_(
                'LVM left the merge of snapshot LV %(snap)s into %(lv)s '
                'pending (one of them is held open): the volume still '
                'reads as before the revert, and becomes the snapshot at '
                'the next activation of %(lv)s that finds neither open, '
                'which consumes the snapshot LV. Release what holds them '
                '(dmsetup info -c), deactivate and activate %(lv)s, then '
                'delete the snapshot.') % {'snap': snap_lv, 'lv': lv_name})
        try:
            self.create_snapshot(snapshot)
        except Exception as err:
            # (Cinder's manager would set it back to available: it is
            # not, its LV is gone.)
            self._mark_snapshot_error(snapshot)
            raise exception.VolumeBackendAPIException(data=_(
                'Volume %(vol)s was reverted to snapshot %(snap)s, whose '
                'LV the merge consumed, but it could not be made again '
                '(%(err)s): delete the snapshot.') % {
                    'vol': volume.id, 'snap': snapshot.id, 'err': err})

    def _lv_listed(self, name):
        """True if LVM still lists LV ``name``, hidden or not.

        A thin snapshot whose merge LVM deferred is hidden: lvs of it by
        name says ``[name]``, which brick's get_volume does not match
        (seen on the real kernel, test_thin_kernel.py).
        """
        return any(lv['name'] in (name, '[%s]' % name)
                   for lv in self.vg.get_volumes(name))

    @staticmethod
    def _mark_snapshot_error(snapshot):
        """Record that a snapshot has no LV any more (best effort)."""
        try:
            snapshot.status = objects.fields.SnapshotStatus.ERROR
            snapshot.save()
        except Exception:
            LOG.exception('Could not mark snapshot %s as error.',
                          snapshot.id)

    def copy_image_to_volume(self, context, volume, image_service, image_id,
                             disable_sparse=False):
        """Write the image through the handle.

        No move of the volume starts meanwhile (Source.writing): no
        attachment shows this writer, and Cinder lets Nova reserve a
        volume whose image is being written.
        """
        action = _('writing an image to it')
        with self.source.writing(volume, action):
            image_utils.fetch_to_raw(context,
                                     image_service,
                                     image_id,
                                     self._ensure_handle(volume, action),
                                     self.configuration.volume_dd_blocksize,
                                     size=volume['size'],
                                     disable_sparse=disable_sparse)

    def copy_volume_to_image(self, context, volume, image_service,
                             image_meta):
        """Read the image through the handle."""
        volume_utils.upload_volume(context,
                                   image_service,
                                   image_meta,
                                   self._ensure_handle(
                                       volume, _('uploading it to an image')),
                                   volume)

    def retype(self, context, volume, new_type, diff, host):
        """Retype within the backend; a live clone takes the new tuning."""
        self.destination.retune(volume, new_type)
        return True

    def migrate_volume(self, ctxt, volume, host, thin=False, mirror_count=0):
        """Move an available volume to another node of this backend.

        ``cinder migrate`` of a detached volume to another node's pool is
        a move (so is a retype with migration, when Cinder lets a driver
        migrate it: the types differ only in backend name and zones): the
        destination builds the clone over this node's export, as for an
        attach there (:meth:`Source.move
        <cinder_dmclone.source.Source.move>`), and the volume is usable
        there at once while it hydrates in the background.  This is how
        an operator drains a node.  (True, None): Cinder's manager then
        names the destination's pool in the volume record, which the
        move has already done.  The volume's status is then
        ``available``, ``maintenance`` (``--lock-volume True``) or
        ``retyping``; Cinder's manager restores the previous one after
        this returns (Source.MIGRATABLE).

        A volume that is moving is refused (MoveInProgress) before any
        other answer: Cinder's generic copy in the middle of a move would
        give the volume a new ``_name_id``, its LV another name, under a
        clone that reads or writes the old one.  Any other target
        (another backend, a node that does not publish its initiator)
        and an attached volume (which Cinder's manager never hands to a
        driver: Nova copies it) get Cinder's generic copy: (False, None).
        A migration that fails or is refused raises, with nothing
        changed: the volume stays here, available, without the export
        made for it (:meth:`_drop_migration_export`) -- unless an iSCSI
        attach from another node uses that export now (one made while the
        migration started): it stays, for that attach.  A move that
        leaves the volume here without an error (the destination's
        service is gone, or the export admits another node) is Cinder's
        generic copy, (False, None), only once that export is gone;
        while another node is admitted, the migration is refused
        (VolumeNotMovable) rather than copied under that node.
        """
        connector = self._migration_connector(volume, host)
        self.source.end_stale_prepare(volume)
        self.source.refuse_if_moving(volume, _('a migration to %s') % (
            connector['host'] if connector else host.get('host')))
        if connector is None:
            return False, None
        try:
            update = self.create_export(ctxt, volume, connector)
            volume.update(update)
            volume.save()
            try:
                info = self.source.move(volume, connector,
                                        self._lv_sectors_reader(volume),
                                        migration=True)
            except Exception:
                with excutils.save_and_reraise_exception():
                    self._drop_migration_export(ctxt, volume, connector)
            if info is None:
                kept = self._drop_migration_export(ctxt, volume, connector)
                if kept:
                    raise dmc_exception.VolumeNotMovable(
                        volume=volume['id'], node=self.node_name,
                        reason=kept)
                return False, None
        finally:
            # (create_export took it for an attach in flight: no
            # initialize_connection follows, the move is made already.)
            self.source.attach_done(volume, connector)
        LOG.info('Volume %(vol)s migrated to %(node)s: it hydrates there in '
                 'the background.', {'vol': volume['id'],
                                     'node': connector['host']})
        # (The export is saved already: returned again, it could land after
        # a fast finalization forgot it.)
        return True, None

    def _drop_migration_export(self, ctxt, volume, connector):
        """Remove the export of a migration that did not move the volume.

        And the record stops naming it, as before the migration (else
        this node's next start would export the volume again).  Only if
        nothing else uses it, under the volume's lock
        (:meth:`Source.drop_migration_export
        <cinder_dmclone.source.Source.drop_migration_export>`): an iSCSI
        attach from another node made while the migration started keeps
        it (its initiator is admitted, or it is connecting), and so does
        a move from here that is still recorded (one whose commit landed
        although its answer was lost hydrates from it, one whose give-up
        waits for the database is given up with it, see
        :meth:`Source.retry_give_ups
        <cinder_dmclone.source.Source.retry_give_ups>`).  Returns None
        once it is gone, else why it stays.  Never raises: the
        migration's own outcome is what the caller reports.
        """
        def remove():
            self.remove_export(ctxt, volume)
            volume.update({'provider_location': None,
                           'provider_auth': None})
            volume.save()
        try:
            return self.source.drop_migration_export(volume, connector,
                                                     remove)
        except Exception:
            LOG.exception('Could not remove the export of volume %s made '
                          'for its migration; it is removed at its next '
                          'detach or delete.', volume['id'])
            return _('the export made for the migration could not be '
                     'removed')

    def _migration_connector(self, volume, host):
        """The connector a move to ``host`` (a scheduler host) uses, or None.

        Only the pool of another node of this very backend qualifies (the
        pool the move names in the volume record: the manager writes the
        scheduler's host after it); its initiator comes from its pool
        stats (``dmclone_initiator``), since no attach brought a
        connector.  Never for an attached volume: Nova copies it.
        """
        caps = host.get('capabilities') or {}
        node = caps.get('dmclone_node')
        initiator = caps.get('dmclone_initiator')
        target = None
        if node and initiator and volume['host'] and host.get('host'):
            section = volume_utils.extract_host(volume['host'], 'backend')
            target = '%s@%s' % (node, section.partition('@')[2])
        if (target is None or node in self._node_names()
                or volume_utils.extract_host(host['host'], 'backend')
                != target or volume.volume_attachment
                or volume_utils.extract_host(host['host'], 'pool')
                != volume_utils.extract_host(volume['host'], 'pool')):
            LOG.info('Migration of volume %(vol)s to %(host)s is not a move '
                     'between nodes of this backend: Cinder copies it.',
                     {'vol': volume['id'], 'host': host.get('host')})
            return None
        return {'host': node, 'initiator': initiator}

    def update_migrated_volume(self, ctxt, volume, new_volume,
                               original_volume_status):
        """Follow the LV rename of a finished migration with the handle."""
        update = super().update_migrated_volume(
            ctxt, volume, new_volume, original_volume_status)
        if update.get('_name_id') is None:
            self._remove_handle(CONF.volume_name_template % new_volume['id'])
            self._ensure_handle(
                {'name': CONF.volume_name_template % volume['id'],
                 'id': volume['id']})
        return update

    # ------------------------------------------------------------------
    # Manage / unmanage
    # ------------------------------------------------------------------

    def _check_manage_reference(self, existing_ref):
        name = existing_ref.get('source-name') if isinstance(
            existing_ref, dict) else None
        try:
            layout.validate_lv_name(name)
        except dmc_exception.InvalidDMName:
            raise exception.ManageExistingInvalidReference(
                existing_ref=existing_ref,
                reason=_('source-name must be a logical volume name.')) \
                from None
        if layout.lv_name_from_metadata_lv(name):
            raise exception.ManageExistingInvalidReference(
                existing_ref=existing_ref,
                reason=_('%s holds dm-clone metadata of a transfer.') % name)
        if layout.is_retiring_lv(name):
            raise exception.ManageExistingInvalidReference(
                existing_ref=existing_ref,
                reason=_('%s is an old copy being wiped.') % name)
        # Cinder refuses an LV named after an existing volume's id; the
        # LV of a volume with a _name_id is named after that instead.
        if recovery.volume_of_lv(cinder_context.get_admin_context(),
                                 name) is not None:
            raise exception.ManageExistingAlreadyManaged(volume_ref=name)

    def manage_existing_get_size(self, volume, existing_ref):
        self._check_manage_reference(existing_ref)
        return super().manage_existing_get_size(volume, existing_ref)

    def manage_existing(self, volume, existing_ref):
        self._check_manage_reference(existing_ref)
        super().manage_existing(volume, existing_ref)
        self._ensure_handle(volume)

    def unmanage(self, volume):
        """Stop managing: the handle goes, the LV stays.

        An aborted move is ended first, as before a delete; a move still
        in progress refuses (see Destination.before_unmanage).
        """
        self.source.give_up_aborted(volume)
        self.destination.before_unmanage(volume)
        self._remove_handle(volume['name'])

    def get_manageable_volumes(self, cinder_volumes, marker, limit, offset,
                               sort_keys, sort_dirs):
        """Cinder's listing, with transfer metadata LVs marked unsafe.

        Cinder tells a volume's LV by the id in its name; a volume with
        a ``_name_id`` names its LV after that instead.  So an LV is
        ``already managed`` by the volume of this node whose ``name`` it
        is, and an LV named like a volume that is not that volume's LV
        (an old copy kept by a move, a stale LV named after the id of a
        volume with a ``_name_id``) is never offered.
        """
        entries = super().get_manageable_volumes(
            cinder_volumes, marker, limit, offset, sort_keys, sort_dirs)
        owners = {v['name']: v['id'] for v in cinder_volumes}
        for entry in entries:
            name = entry['reference']['source-name']
            if name in owners:
                entry['safe_to_manage'] = False
                entry['reason_not_safe'] = 'already managed'
                entry['cinder_id'] = owners[name]
            elif layout.lv_name_from_metadata_lv(name):
                entry['safe_to_manage'] = False
                entry['reason_not_safe'] = 'dm-clone transfer metadata'
            elif layout.is_retiring_lv(name):
                entry['safe_to_manage'] = False
                entry['reason_not_safe'] = 'old copy being wiped'
            elif (entry['safe_to_manage'] or entry['cinder_id']) and \
                    volume_utils.extract_id_from_volume_name(name):
                # Named like a volume whose LV it is not: an old copy
                # kept by a move (rolled back, abandoned as lost).
                entry['safe_to_manage'] = False
                entry['cinder_id'] = None
                entry['reason_not_safe'] = ('named like another volume: '
                                            'maybe an old copy kept by a '
                                            'move')
        return entries

    # ------------------------------------------------------------------
    # Stats
    # ------------------------------------------------------------------

    def _update_volume_stats(self):
        super()._update_volume_stats()
        if not self._stats:
            return
        self._stats['vendor_name'] = 'Open Source'
        self._stats['driver_version'] = self.VERSION
        clones = self._own_clone_statuses()
        transfers = None if clones is None else len(clones)
        thin_pool = self._thin_pool_stats(clones)
        for pool in self._stats['pools']:
            pool.update(thin_pool)
            pool.update(
                location_info='DMCloneVolumeDriver:%s:%s:%s:%s' % (
                    self.node_name, self.configuration.volume_group,
                    self.configuration.lvm_type,
                    self.configuration.lvm_mirrors),
                online_extend_support=True,
                multiattach=True,
                dmclone_node=self.node_name,
                dmclone_initiator=self._initiator(),
                dmclone_region_size_kb=self.configuration.dmclone_region_size,
                dmclone_metadata_volume_group=self._metadata_vg_name(),
                dmclone_transfers_in_flight=transfers,
                dmclone_transfers=self._transfer_progress())

    def _initiator(self):
        """This node's iSCSI initiator, for moves by migration; or None."""
        try:
            return self.peer.own_connector().get('initiator')
        except Exception:
            LOG.warning('Could not read this node\'s iSCSI initiator name; '
                        'a migration to this node is a generic copy.',
                        exc_info=True)
            return None

    def _transfer_progress(self):
        """Per-volume hydration progress for the pool stats, or {}."""
        try:
            return self.moves.tracker.progress_report()
        except Exception:
            LOG.warning('Could not report the progress of transfers.',
                        exc_info=True)
            return {}

    def _own_clone_statuses(self):
        """{handle: status} of this backend's clones: moves into this node.

        Their number is published in the pool stats so an admin
        (``cinder get-pools --detail``) sees how busy each node is with
        incoming transfers, and on a thin pool what they will still
        write; one ``dmsetup status --target clone`` call, as the
        monitor makes.  None when device-mapper cannot be read: a stats
        report must not fail because of it.
        """
        try:
            statuses = self.dm.clone_statuses()
        except (dmc_exception.DMSetupCommandFailed,
                dmc_exception.DMStatusParseError):
            LOG.warning('Could not count the transfers in flight.',
                        exc_info=True)
            return None
        return {name: status for name, status in statuses.items()
                if layout.lv_name_from_handle(
                    name, self.configuration.volume_group) is not None}

    def _thin_pool_stats(self, clones):
        """A thin pool's figures for the pool stats, over Cinder's; or {}.

        Cinder's LVM driver reports a thin pool's free data space as it
        is now, and as provisioned every LV of the volume group but the
        pool.  A clone moving here still writes the regions it has not
        hydrated, and a pool whose metadata is full takes no more data:
        ``free_capacity_gb`` is what the pool can still take
        (:func:`cinder_dmclone.thin.free_bytes`) less what the moves
        into this node will still write (``dmclone_hydration_pending_gb``,
        :meth:`_pending_bytes`), and
        ``provisioned_capacity_gb`` the virtual sizes of the pool's thin
        LVs (not the thick metadata LVs of clones), as the destination
        of a move counts them (:meth:`Clones.check_thin_pool
        <cinder_dmclone.clone.Clones.check_thin_pool>`).  The other
        thin figures (``thin_provisioning_support``,
        ``max_over_subscription_ratio``, ``reserved_percentage``) are
        Cinder's.  {} (Cinder's figures stay) for a thick backend, or
        when LVM cannot be read.
        """
        if self.configuration.lvm_type != 'thin':
            return {}
        try:
            lvs = privileged.thin_lvs(self.configuration.volume_group,
                                      execute=self._execute,
                                      root_helper=utils.get_root_helper())
            pool = thin.pool_usage(lvs, self._thin_pool_name())
        except (dmc_exception.PrivilegedCommandFailed,
                dmc_exception.LVSParseError):
            LOG.warning('Could not read thin pool %s: its free capacity is '
                        'reported without the writes of the moves into '
                        'this node.', self._thin_pool_name(), exc_info=True)
            return {}
        pending = self._pending_bytes(lvs, pool, clones or {})
        return {
            'free_capacity_gb': round(
                thin.free_bytes(pool, pending) / units.Gi, 2),
            'provisioned_capacity_gb': round(pool.provisioned / units.Gi, 2),
            'dmclone_hydration_pending_gb': round(pending / units.Gi, 2)}

    def _pending_bytes(self, lvs, pool, clones):
        """What the moves into the thin pool still write, as a move counts.

        As the destination of a move counts them
        (:meth:`Clones.pending_writes <cinder_dmclone.clone.Clones.
        pending_writes>`): every data LV with a metadata LV beside it,
        its clone loaded or not.  Without ``dmclone_thin_map``, what
        LVM says each lacks, never less than the loaded clones
        (``clones``, {handle: status}) say; with it, move by move, a
        working clone by what it still copies
        (:func:`cinder_dmclone.thin.pending_bytes`).
        """
        meta_vg = self.metadata_vg or self.vg
        names = {name for name in (layout.lv_name_from_metadata_lv(lv['name'])
                                   for lv in meta_vg.get_volumes()) if name}
        if not self.configuration.dmclone_thin_map:
            return max(thin.unhydrated_bytes(clones.values()),
                       thin.unwritten_bytes(lvs, pool.name, names))
        vg_name = self.configuration.volume_group
        loaded = {layout.lv_name_from_handle(name, vg_name): status
                  for name, status in clones.items()}
        return thin.pending_bytes(lvs, pool, names, loaded,
                                  clone.Clones.MAX_DISCARD_COMMANDS + 1)

    # ------------------------------------------------------------------
    # Exports and connections
    # ------------------------------------------------------------------

    def ensure_export(self, context, volume):
        """Rebuild the handle (gone after a reboot) and the iSCSI export.

        After a reboot, LIO's helper restores every saved target at the
        first call, each over its volume's handle: so the handles of all
        the volumes this node exports are rebuilt first, not only this
        volume's.  A volume moving in whose clone this start could not
        build again (its source node was down too) is left without a
        handle, and in-use: the monitor builds its clone once the source
        answers (Recovery.retry_rebuilds); an error here would have
        Cinder set it to ``error`` for good.
        """
        if volume['id'] in self.moves.recovery.pending_rebuild:
            LOG.warning('Volume %s moves into this node and its clone could '
                        'not be built again: its source node does not '
                        'answer yet. The monitor tries again every minute; '
                        'until then the volume cannot be attached here.',
                        volume['id'])
            return None
        path = self._ensure_handle(volume)
        if not self._owns_export(volume):
            return None
        self._ensure_exported_handles(context)
        return self.target_driver.ensure_export(context, volume, path)

    def _ensure_export_moving_away(self, volume):
        """The export of a volume whose move from here goes on.

        Startup recovery's REEXPORT (see Source.export_again): the record
        names the destination, so Cinder's start never calls
        :meth:`ensure_export` for it here.  Every exported handle first,
        as there: LIO's helper restores all saved targets at once.
        """
        ctxt = cinder_context.get_admin_context()
        self._ensure_exported_handles(ctxt)
        path = self._ensure_handle(volume)
        return self.target_driver.ensure_export(ctxt, volume, path)

    def _exported_volumes(self, context):
        """The volumes whose export is this node's, moving away or not."""
        volumes = {v.id: v for v in objects.VolumeList.get_all_by_host(
            context, self.host) if self._owns_export(v)}
        for volume in recovery.volumes_naming(context, 'source_node',
                                              self._node_names()):
            try:
                t = self.source.load(volume.id)
            except Exception:
                # (Deleted meanwhile, or a record recovery reports.)
                LOG.warning('Not exporting volume %s again: its move '
                            'cannot be read.', volume.id, exc_info=True)
                continue
            if self.source.is_source(t) and recovery.reads_source(
                    t, self.source.names_destination(volume, t)):
                volumes.setdefault(volume.id, volume)
        return list(volumes.values())

    def _ensure_exported_handles(self, context):
        """Rebuild the handle of every volume exported here (once a start).

        Those of volumes moving away count: LIO's saved targets are all
        restored at the first call, each over its handle.  A volume whose
        handle cannot be rebuilt (a move into this node without its
        clone) is logged and left: its saved target then stays without
        its LUN, and its own ensure_export fails.
        """
        if self._exported_handles_ready:
            return
        for volume in self._exported_volumes(context):
            try:
                self._ensure_handle(volume)
            except Exception:
                LOG.warning('Could not rebuild the handle of volume %s, '
                            'which this node exports.', volume.id,
                            exc_info=True)
        self._exported_handles_ready = True

    def create_export(self, context, volume, connector, vg=None):
        """Export the handle over iSCSI, unless the attach is local.

        A connector on this node gets the handle itself (see
        initialize_connection): no target, no network.  A destination
        building a clone exports nothing either.  While the volume is
        moving, no other node gets an export: it would hold the clone open
        and outlive a rollback.
        """
        step = peer.payload(connector)
        if step:
            # Refused here, before the manager could take a failed attach
            # for a reason to remove this volume's export.
            self.moves.endpoint.check(volume, step, peer.BY_INITIALIZE)
            return {}
        self._require_host(connector)
        if not self._is_local_connector(connector):
            self.source.end_stale_prepare(volume)
            self.source.refuse_if_moving(
                volume, _('attaching on %s') % connector['host'])
        path = self._ensure_handle(
            volume, _('attaching on %s') % connector['host'])
        if self._is_local_connector(connector):
            return {}
        export_info = self.source.export_for_attach(
            volume,
            lambda: self.target_driver.create_export(context, volume, path),
            connector)
        return {'provider_location': export_info['location'],
                'provider_auth': export_info['auth']}

    def remove_export(self, context, volume):
        """Remove this node's export, never one a transfer still reads."""
        if self.source.keeps_export(volume):
            LOG.debug('Volume %s is moving away: its export stays until '
                      'the transfer ends.', volume['id'])
            return
        if not self._owns_export(volume):
            return
        self.target_driver.remove_export(context, volume)

    def _owns_export(self, volume):
        """True if the volume's export is this node's.

        By the primary portal of its ``provider_location``
        (:func:`~cinder_dmclone.layout.export_portal`), which is
        ``target_ip_address``.
        """
        portal = layout.export_portal(volume.get('provider_location'))
        address, sep, _port = portal.rpartition(':')
        return bool(sep) and _same_address(
            address, self.configuration.target_ip_address)

    def validate_connector(self, connector):
        if not peer.payload(connector):
            self._require_host(connector)
        if self._is_local_connector(connector):
            return True
        return self.target_driver.validate_connector(connector)

    def initialize_connection(self, volume, connector):
        """Local for this node; a move for an instance elsewhere.

        An instance attaching from another node that runs this backend
        moves the volume there (see cinder_dmclone.source); anything else
        from another node gets an iSCSI connection.
        """
        step = peer.payload(connector)
        if step:
            return self._local_connection(
                volume, self.moves.endpoint.receive(volume, connector, step,
                                                    peer.BY_INITIALIZE))
        self._require_host(connector)
        if self._is_local_connector(connector):
            self.source.refuse_local_attach(volume, _('attaching it here'))
            return self._local_connection(
                volume, self._ensure_handle(volume, _('attaching it here')))
        try:
            return self._connect_remote(volume, connector)
        finally:
            self.source.attach_done(volume, connector)

    def _connect_remote(self, volume, connector):
        """A move to the connector's node, or an iSCSI connection."""
        if self.source.wants_move(volume, connector):
            try:
                info = self.source.move(volume, connector,
                                        self._lv_sectors_reader(volume))
            except Exception:
                with excutils.save_and_reraise_exception():
                    self._user_message(volume,
                                       message_field.Action.UPDATE_ATTACHMENT,
                                       message_field.Detail.ATTACH_ERROR)
            if info is not None:
                return info
        return self.source.connect_over_iscsi(
            volume, connector, super().initialize_connection)

    def _lv_sectors_reader(self, volume):
        """The LV's length, read when called (Source.move: under the lock)."""
        path = self._lv_path(volume['name'])
        return lambda: self.dm.device_sectors(path)

    @staticmethod
    def _user_message(volume, action, detail):
        """Leave a user message for the volume's owner; never raise.

        The attach request itself fails with the precise reason; the
        message keeps a trace the project can list afterwards, as Cinder
        does for its own failures.
        """
        try:
            ctxt = cinder_context.get_admin_context()
            ctxt.project_id = volume['project_id']
            message_api.API().create(ctxt, action,
                                     resource_uuid=volume['id'],
                                     detail=detail)
        except Exception:
            LOG.exception('Could not record a user message for volume %s.',
                          volume['id'])

    @staticmethod
    def _local_connection(volume, path):
        return {'driver_volume_type': 'local',
                'data': {'device_path': path,
                         'volume_id': volume['id'],
                         'access_mode': 'rw'}}

    def terminate_connection(self, volume, connector, **kwargs):
        step = peer.payload(connector)
        if step:
            self.moves.endpoint.receive(volume, connector, step,
                                        peer.BY_TERMINATE)
            return False
        # (A rollback its destination cut short ends here first; the
        # detach then goes on as any here: the export goes.)
        self.source.finish_rollback(volume)
        if self.destination.detached(volume, connector):
            return False
        if self._is_local_connector(connector):
            # Nothing was exported for a local attach.  Tell the manager
            # the "target" is still shared while other attachments remain.
            return len(volume.volume_attachment) > 1
        if self.source.keeps_acl(volume, connector):
            self.source.pass_on_detach(volume, connector)
            return False
        return super().terminate_connection(volume, connector, **kwargs)
