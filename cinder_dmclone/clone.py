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

"""The clone of a volume moving into this node, on this node's kernel.

:class:`Clones` is everything the destination does to LVM, the iSCSI
initiator and device-mapper for one move: create the volume and metadata
LVs, log in to the source's export, build the clone, enable hydration,
swap the finished clone for a linear table, tear it all down.  Every step
is safe to run again.  It knows moves (:class:`cinder_dmclone.move.Move`)
but never reads or writes their state: that is the destination side's
(:mod:`cinder_dmclone.destination`).
"""

from oslo_log import log as logging
from oslo_utils import units

from cinder.scheduler import sched_utils
from cinder.volume import volume_utils

from cinder_dmclone import dmsetup
from cinder_dmclone import exception as dmc_exception
from cinder_dmclone import layout
from cinder_dmclone import privileged
from cinder_dmclone import thin

LOG = logging.getLogger(__name__)

#: Brick LVM reads a volume group's free space as LVM prints it, in GiB
#: to two decimals rounded to the nearest: the real figure may be up to
#: this much lower (255 free extents of 4 MiB print as 1.00).
FREE_SPACE_PRINT_ERROR = 0.005

#: Why a thin pool cannot take a move (ThinPoolFull), per shortfall.
_THIN_DATA = (
    'has %(free).2f GiB of data space free beyond its reserved_percentage '
    '(%(reserved)s%%), %(need).2f GiB needed: %(writes_why)s, and the '
    'moves into this node still hydrating will write %(pending).2f GiB')
_THIN_METADATA = (
    'has %(free).2f MiB of metadata space free beyond its '
    'reserved_percentage (%(reserved)s%%), %(need).2f MiB needed to map '
    'what %(writes_why)s, and the moves into this node still hydrating '
    '(%(pending).2f GiB)')
_THIN_PROVISIONED = (
    'would hold %(need).2f GiB of thin volumes, more than its '
    'max_over_subscription_ratio (%(ratio)s) allows: %(free).2f GiB')
#: What a move writes into the pool, for those messages.
_WRITES_WHOLE = ('a move writes every region of the volume '
                 '(%(writes).2f GiB)')
_WRITES_MAPPED = (
    'a move with its source\'s region map writes %(writes).2f GiB, what '
    'it copies (%(copied).2f GiB) and room for writes during the move '
    '(%(headroom).2f GiB: the other %(rest).2f GiB of the volume over '
    'max_over_subscription_ratio %(ratio)s)')


class Clones(object):
    """The destination's steps on this node, each safe to run again.

    ``vg``/``meta_vg`` are Cinder brick LVM objects of the data and
    metadata volume groups, ``dm`` a :class:`~.privileged.DMSetup`,
    ``connector`` an os-brick iSCSI connector and ``execute`` Cinder's.
    ``discard(lv_name)`` removes the data LV (the driver's
    :class:`~cinder_dmclone.wiper.Wiper`, which honours ``volume_clear``);
    by default it is simply deleted.  With ``lvm_type = thin`` the data
    LVs are thin LVs of ``thin_pool`` (Cinder's ``<vg>-pool``), which a
    move must fit in as the backend's ``max_over_subscription_ratio``
    and ``reserved_percentage`` say (see :meth:`check_space`).  With
    ``thin_map`` (``dmclone_thin_map``) region maps are applied here,
    and a move counts what it copies (see :meth:`check_thin_pool`).
    """

    def __init__(self, dm, vg, meta_vg, connector, execute, root_helper,
                 lvm_type='default', metadata_reserve=2.0, discard=None,
                 thin_pool=None, max_over_subscription_ratio='20.0',
                 reserved_percentage=0, thin_map=False):
        self.discard = discard or vg.delete
        self.dm = dm
        self.vg = vg
        self.meta_vg = meta_vg
        self.connector = connector
        self._execute = execute
        self._root_helper = root_helper
        self.lvm_type = lvm_type
        self.metadata_reserve = metadata_reserve
        self.thin_pool = thin_pool or '%s-pool' % vg.vg_name
        self.max_over_subscription_ratio = max_over_subscription_ratio
        self.reserved_percentage = reserved_percentage
        #: region maps are applied here (dmclone_thin_map): a loaded
        #: clone counts only what it still copies (see pending_writes).
        self.thin_map = thin_map

    # -- names ----------------------------------------------------------

    def handle_name(self, t):
        return layout.handle_name(self.vg.vg_name, t.lv_name)

    def lv_path(self, t):
        return layout.lv_device(self.vg.vg_name, t.lv_name)

    def meta_path(self, t):
        return layout.lv_device(self.meta_vg.vg_name,
                                layout.metadata_lv_name(t.lv_name))

    # -- build ----------------------------------------------------------

    def metadata_bytes(self, t):
        return layout.metadata_size_bytes(
            t.clone_sectors * dmsetup.SECTOR_SIZE,
            t.region_sectors * dmsetup.SECTOR_SIZE,
            self.metadata_reserve)

    def check_space(self, t, size_gb, node_name, needed=None):
        """Refuse a move the volume groups here cannot hold, up front.

        Checked before anything is created, so that a full node answers
        with a clear error instead of failing half way through the build.
        The metadata LV is always thick, in the metadata volume group; a
        thick data LV takes ``size_gb`` of its volume group, a thin one
        what :meth:`check_thin_pool` says of its pool.  ``needed``: the
        regions of the source's map that this move applies
        (:meth:`apply_map`), or None: it copies every region.
        """
        meta_gb = self.metadata_bytes(t) / units.Gi
        if self.lvm_type == 'thin':
            needs = [(self.meta_vg, meta_gb)]
        elif self.meta_vg.vg_name == self.vg.vg_name:
            needs = [(self.vg, size_gb + meta_gb)]
        else:
            needs = [(self.vg, float(size_gb)), (self.meta_vg, meta_gb)]
        if self.lvm_type == 'thin':
            self.check_thin_pool(t, size_gb, node_name, needed)
        for vg, need in needs:
            vg.update_volume_group_info()
            if vg.vg_free_space - FREE_SPACE_PRINT_ERROR < need:
                raise dmc_exception.DestinationFull(
                    node=node_name, volume=t.volume_id, vg=vg.vg_name,
                    free=vg.vg_free_space, need=need)

    def check_thin_pool(self, t, size_gb, node_name, needed=None):
        """Refuse a move into a thin pool that cannot hold it: ThinPoolFull.

        What the move writes (:meth:`move_writes`: every region of its
        clone, or with a map what the map leaves to copy and room for
        the rest), with what the other moves here will still write
        (:meth:`pending_writes`), counts against the pool's free data
        and metadata space, and the volume's virtual size against the
        over-subscription the backend allows
        (:func:`~cinder_dmclone.thin.shortfall`).  The pool is read from
        LVM now (:func:`~cinder_dmclone.privileged.thin_lvs`); a report
        that cannot be read fails the move.  The caller serialises the
        check with the creation of the LVs (:func:`~cinder_dmclone.move.
        space_lock`), so that the next move's check sees this one's LV;
        and it gives the move up if a map counted here is not applied
        (the clone is then torn down before it copies anything), so a
        move never copies more than was checked.
        """
        lvs = privileged.thin_lvs(self.vg.vg_name, execute=self._execute,
                                  root_helper=self._root_helper)
        pool = thin.pool_usage(lvs, self.thin_pool)
        ratio = self.max_ratio(pool)
        virtual = size_gb * units.Gi
        writes, writes_why = self.move_writes(t, virtual, pool, ratio,
                                              needed)
        pending = self.pending_writes(lvs, skip=t.lv_name)
        short = thin.shortfall(pool, virtual, writes, pending, ratio,
                               self.reserved_percentage)
        if short is None:
            return
        gib = {'free': short.available / units.Gi,
               'need': short.needed / units.Gi,
               'writes_why': writes_why, 'pending': pending / units.Gi,
               'reserved': self.reserved_percentage, 'ratio': ratio}
        if short.kind == 'data':
            reason = _THIN_DATA % gib
        elif short.kind == 'metadata':
            reason = _THIN_METADATA % dict(
                gib, free=short.available / units.Mi,
                need=short.needed / units.Mi)
        else:
            reason = _THIN_PROVISIONED % gib
        raise dmc_exception.ThinPoolFull(
            node=node_name, volume=t.volume_id,
            pool='%s/%s' % (self.vg.vg_name, self.thin_pool),
            reason=reason, kind=short.kind, free=gib['free'],
            need=gib['need'])

    def move_writes(self, t, virtual, pool, ratio, needed):
        """What move ``t`` writes into the pool, and the words that say so.

        Without a map, every region of its clone: the destination's thin
        LV ends fully allocated however little the source's held.  With
        one (``needed``), what its discard plan leaves to copy, in the
        pool's chunks (:func:`~cinder_dmclone.thin.copied_bytes`), and
        room for what the instance may write during the move into the
        ``virtual`` bytes of the volume not copied
        (:func:`~cinder_dmclone.thin.headroom`, over ``ratio``); never
        more than a full copy.
        """
        whole = t.clone_sectors * dmsetup.SECTOR_SIZE
        if needed is None:
            return whole, _WRITES_WHOLE % {'writes': whole / units.Gi}
        copied = thin.copied_bytes(needed, t.clone_sectors,
                                   t.region_sectors, pool.chunk_size,
                                   self.MAX_DISCARD_COMMANDS)
        room = thin.headroom(virtual, copied, ratio)
        writes = min(copied + room, max(whole, copied))
        return writes, _WRITES_MAPPED % {
            'copied': copied / units.Gi, 'headroom': room / units.Gi,
            'rest': max(virtual - copied, 0) / units.Gi, 'ratio': ratio,
            'writes': writes / units.Gi}

    def moving_in(self):
        """Data LVs here with a metadata LV beside them (moves into here).

        Built, being built, or waiting for their clone to be rebuilt.
        """
        names = (layout.lv_name_from_metadata_lv(lv['name'])
                 for lv in self.meta_vg.get_volumes())
        return {name for name in names if name}

    def pending_writes(self, lvs, skip=None):
        """What the moves into this thin pool will still write to it.

        Every move with a metadata LV here counts, its clone loaded or
        not; an LV created since ``lvs`` was read counts whole.
        ``skip``: the LV of the move being checked, counted already.
        Without ``thin_map`` as LVM tells
        (:func:`~cinder_dmclone.thin.unwritten_bytes`: each LV's virtual
        size less what it holds), never less than the loaded clones tell
        (:meth:`unhydrated_bytes`): a move copies every region.  With
        it, move by move (:func:`~cinder_dmclone.thin.pending_bytes`): a
        working clone by what it still copies (the regions its map
        discarded count as hydrated), any other whole.
        """
        names = self.moving_in() - {skip}
        created = {}
        for name in sorted(names - set(lvs)):
            lv = self.vg.get_volume(name)
            if lv is not None:
                created[name] = int(float(lv['size']) * units.Gi)
        if not self.thin_map:
            unwritten = thin.unwritten_bytes(lvs, self.thin_pool, names)
            return max(unwritten + sum(created.values()),
                       self.unhydrated_bytes())
        clones = self.loaded_clones()
        clones.pop(skip, None)
        pending = thin.pending_bytes(
            lvs, thin.pool_usage(lvs, self.thin_pool), names, clones,
            self.MAX_DISCARD_COMMANDS + 1)
        return pending + sum(size for name, size in created.items()
                             if name not in clones)

    def loaded_clones(self):
        """{LV name: dm-clone status} of the clones of this volume group.

        One ``dmsetup status --target clone``, as the monitor reads.
        """
        vg_name = self.vg.vg_name
        return {layout.lv_name_from_handle(name, vg_name): status
                for name, status in self.dm.clone_statuses().items()
                if layout.lv_name_from_handle(name, vg_name)}

    def unhydrated_bytes(self):
        """What the clones of this volume group will still write to it."""
        return thin.unhydrated_bytes(self.loaded_clones().values())

    def max_ratio(self, pool):
        """The backend's max_over_subscription_ratio, ``auto`` resolved.

        As Cinder's scheduler resolves it for the pool's figures.
        """
        ratio = volume_utils.get_max_over_subscription_ratio(
            self.max_over_subscription_ratio, supports_auto=True)
        if ratio != 'auto':
            return ratio
        return sched_utils.calculate_max_over_subscription_ratio(
            {'thin_provisioning_support': True,
             'total_capacity_gb': pool.size / units.Gi,
             'free_capacity_gb': pool.data_free / units.Gi,
             'provisioned_capacity_gb': pool.provisioned / units.Gi,
             'max_over_subscription_ratio': 'auto'}, 'auto')

    def create_volumes(self, t, size_gb):
        """Create the data LV and a freshly zeroed metadata LV.

        Only called in ``preparing``: the metadata LV is zeroed right after
        it is created, never later (zeroing a used one would forget which
        regions hold the instance's writes).
        """
        # The metadata LV comes first: it is what recovery looks for, so a
        # crash between the two creations leaves nothing it cannot see.
        meta_name = layout.metadata_lv_name(t.lv_name)
        if self.meta_vg.get_volume(meta_name) is None:
            if self.has_data(t):
                # Never a fresh metadata LV beside a data LV that may hold
                # writes: it would say that no region does.
                raise self.metadata_lost(t)
            size = self.metadata_bytes(t)
            self.meta_vg.create_volume(meta_name, '%dm' % (size // units.Mi),
                                       'default')
            self._zero_head(self.meta_path(t))
        if self.vg.get_volume(t.lv_name) is None:
            self.vg.create_volume(t.lv_name, '%dg' % size_gb, self.lvm_type)

    def _zero_head(self, path):
        """Zero the metadata LV's first MiB so dm-clone formats it."""
        privileged.zero_metadata_head(path, execute=self._execute,
                                      root_helper=self._root_helper)

    def connect_source(self, t, provider_auth):
        """Log in to the source's export; return the local device path."""
        info = self.connector.connect_volume(
            t.source_properties(provider_auth))
        path = info['path']
        size = self.dm.device_sectors(path)
        if size < t.clone_sectors:
            self.connector.disconnect_volume(
                t.source_properties(provider_auth), info, force=True,
                ignore_errors=True)
            raise dmc_exception.InvalidTable(
                reason='source device %s of volume %s has %d sectors, the '
                       'clone needs %d' % (path, t.volume_id, size,
                                           t.clone_sectors))
        return path

    def disconnect_source(self, t, provider_auth):
        self.connector.disconnect_volume(
            t.source_properties(provider_auth), None, force=True,
            ignore_errors=True)

    def clone_table(self, t, source_path, hydrate, threshold=None,
                    batch_size=None, discard_passdown=True):
        """Clone over the transfer's length, linear beyond (an extension)."""
        lv = self.lv_path(t)
        segments = [dmsetup.clone_segment(
            0, t.clone_sectors, self.meta_path(t), lv, source_path,
            t.region_sectors, hydration=hydrate,
            discard_passdown=discard_passdown,
            hydration_threshold=threshold, hydration_batch_size=batch_size)]
        total = self.dm.device_sectors(lv)
        if total > t.clone_sectors:
            segments.append(dmsetup.linear_segment(
                t.clone_sectors, total - t.clone_sectors, lv,
                t.clone_sectors))
        return segments

    def build_clone(self, t, source_path, hydrate, threshold=None,
                    batch_size=None, discard_passdown=True):
        """Create the clone under the volume's handle (idempotent).

        Without ``discard_passdown`` (``no_discard_passdown``), a discard
        through the clone never reaches the data LV: the table that
        :meth:`apply_map` needs.
        """
        name = self.handle_name(t)
        if self.dm.exists(name):
            if any(s.target == 'clone' for s in self.dm.table(name)):
                return layout.handle_path(self.vg.vg_name, t.lv_name)
            raise dmc_exception.InvalidTable(
                reason='handle %s exists without a clone table; refusing '
                       'to replace it' % name)
        if not self.has_metadata(t):
            raise self.metadata_lost(t)
        self.dm.create(name, self.clone_table(t, source_path, hydrate,
                                              threshold, batch_size,
                                              discard_passdown),
                       uuid=layout.handle_uuid(self.vg.vg_name, t.lv_name))
        return layout.handle_path(self.vg.vg_name, t.lv_name)

    # -- the thin map ----------------------------------------------------

    #: At most this many discards (one root command each) apply a map:
    #: the prepare that runs them waits within the transfer timeout.
    MAX_DISCARD_COMMANDS = 64

    def reads_zeroes(self, recorded_if_inactive=False):
        """True if a new data LV here reads zeroes where nothing is written.

        A thin LV, fresh and unprovisioned, in a pool that zeroes the
        blocks it maps anew (:func:`~cinder_dmclone.privileged.
        pool_zeroes`: no ``skip_block_zeroing``), so that a later partial
        write into a region never copied exposes nothing else.  Never a
        thick LV: it holds whatever its extents held.

        ``recorded_if_inactive``: a pool with no thin LV yet is not
        active (LVM activates its ``-tpool`` device with the first), so
        its table cannot be read; LVM's record, which its activation
        will load, answers instead.  Only for the decision before the
        build: the table is read again once the LVs exist, before the
        clone is used (Destination._apply_map).
        """
        if self.lvm_type != 'thin':
            return False
        try:
            return privileged.pool_zeroes(self.vg.vg_name, self.thin_pool,
                                          execute=self._execute,
                                          root_helper=self._root_helper)
        except dmc_exception.DMDeviceNotFound:
            if not recorded_if_inactive:
                raise
        return privileged.pool_zeroing_recorded(
            self.vg.vg_name, self.thin_pool, execute=self._execute,
            root_helper=self._root_helper)

    def clone_status(self, t):
        """The clone's parsed status; InvalidTable if it has no working one."""
        return self._clone_status(t)

    def _clone_status(self, t):
        name = self.handle_name(t)
        status = [s.clone for s in self.dm.status(name) if s.clone]
        if not status or status[0].failed:
            raise dmc_exception.InvalidTable(
                reason='handle %s has no working clone: %s' % (name, status))
        return status[0]

    def apply_map(self, t, needed):
        """Mark hydrated, without copying, the regions not in ``needed``.

        ``needed`` are the runs of regions that hold data on the source
        (:func:`~cinder_dmclone.thin.decode_regions`).  The others are
        discarded through the clone (whole regions only, at most
        :data:`MAX_DISCARD_COMMANDS` ranges: see
        :func:`~cinder_dmclone.thin.discard_plan`), which marks them
        hydrated and reads nothing from the source.  Only on a clone
        just built: ``no_hydration``, ``no_discard_passdown``, and no
        region hydrated yet; anything else raises InvalidTable before a
        discard is sent, since a discard racing a copy or over a written
        region loses data.  Its path is not returned yet, but udev's
        rules (blkid, LVM autoactivation, mdadm) may open the new device:
        an open clone gets no discard, and None is returned (every region
        is copied); one opened while the discards ran raises InvalidTable
        (the move is given up: a discard may have raced a write).  Then
        ``dmsetup
        status`` (without ``--noflush``) commits the bitmap: metadata
        read-only (the commit failed) raises InvalidTable, and the kernel
        must count exactly the regions discarded: any other count raises
        InvalidTable too (the move is then given up).  Returns that
        count.
        """
        before = self._clone_status(t)
        if (before.hydration_enabled or before.hydrated_regions
                or 'no_discard_passdown' not in before.features):
            raise dmc_exception.InvalidTable(
                reason='refusing to apply the region map of volume %s: its '
                       'clone is not fresh (hydration %s, %d regions '
                       'hydrated, features %s)'
                       % (t.volume_id, 'on' if before.hydration_enabled
                          else 'off', before.hydrated_regions,
                          ' '.join(before.features)))
        if self._opened(t):
            return None
        ranges = thin.discard_plan(needed, t.clone_sectors, t.region_sectors,
                                   self.MAX_DISCARD_COMMANDS)
        privileged.discard_regions(self.vg.vg_name, t.lv_name, ranges,
                                   execute=self._execute,
                                   root_helper=self._root_helper)
        if self._opened(t):
            raise dmc_exception.InvalidTable(
                reason='the clone of volume %s was opened while its region '
                       'map was applied; its map is not trusted'
                       % t.volume_id)
        expected = sum(sectors for _start, sectors in ranges) \
            // t.region_sectors
        after = self._clone_status(t)
        if after.read_only:
            # The commit above failed: the discards are counted in core
            # only, and the clone cannot hydrate.
            raise dmc_exception.InvalidTable(
                reason='the clone of volume %s turned its metadata '
                       'read-only when its region map was committed'
                       % t.volume_id)
        if after.hydrated_regions != expected:
            raise dmc_exception.InvalidTable(
                reason='the clone of volume %s counts %d regions hydrated '
                       'after %d were discarded; its region map is not '
                       'trusted' % (t.volume_id, after.hydrated_regions,
                                    expected))
        return expected

    def _opened(self, t):
        """True (logged) if something has the clone of ``t`` open."""
        count = self.dm.open_count(self.handle_name(t))
        if count > 0:
            LOG.warning('The clone of volume %(vol)s is open (%(n)d '
                        'opener(s)) before its path was handed out: no '
                        'region of it is discarded.',
                        {'vol': t.volume_id, 'n': count})
        return count > 0

    def enable_hydration(self, t):
        self.dm.message(self.handle_name(t), 'enable_hydration')

    def disable_hydration(self, t):
        self.dm.message(self.handle_name(t), 'disable_hydration')

    def tune(self, t, threshold, batch_size):
        name = self.handle_name(t)
        self.dm.message(name, 'hydration_threshold', threshold)
        self.dm.message(name, 'hydration_batch_size', batch_size)

    def extend(self, t):
        """Reload the table after the data LV grew: clone + linear tail.

        Under an explicit suspend (:meth:`DMSetup.swap`), never a plain
        reload: the new clone table reads the metadata when it is built,
        and the live one commits its last hydrated regions only when it
        is suspended.  Built earlier, the new table would copy those
        regions again from the source, over the instance's newer writes.
        """
        name = self.handle_name(t)
        current = self.dm.table(name)
        clone = [s for s in current if s.target == 'clone']
        if not clone:
            return False
        args = dmsetup.parse_clone_table(clone[0])
        status = self.dm.status(name)[0].clone
        table = self.clone_table(
            t, args.source_dev,
            hydrate=bool(status and status.hydration_enabled),
            threshold=args.core_args.get('hydration_threshold'),
            batch_size=args.core_args.get('hydration_batch_size'))
        self.dm.swap(name, table)
        return True

    # -- finish ---------------------------------------------------------

    def hydrated(self, t):
        name = self.handle_name(t)
        if not self.dm.exists(name):
            return False
        status = [s.clone for s in self.dm.status(name) if s.clone]
        if not status:
            return True     # already linear
        return status[0].fully_hydrated

    def swap_to_linear(self, t, before=None):
        """Replace a fully hydrated clone by a linear map of the LV.

        ``before()`` runs once the clone is found fully hydrated, just
        before its table is replaced (not when there is nothing to swap).
        """
        name = self.handle_name(t)
        if not self.dm.exists(name):
            # Gone with a reboot: once the metadata LV is removed the swap
            # was done (the driver maps the LV again); before, only a
            # rebuilt clone can tell whether the LV is complete.  Read
            # from LVM's own listing: a group it cannot list raises
            # LVMUnlisted (the finalization, which retires the source
            # next, waits).
            if self.listed(t)[1]:
                raise dmc_exception.InvalidTable(
                    reason='handle %s is gone before its clone was swapped '
                           'to linear; the clone must be rebuilt first'
                           % name)
            return
        if not any(s.target == 'clone' for s in self.dm.table(name)):
            return
        if not self.hydrated(t):
            raise dmc_exception.InvalidTable(
                reason='refusing to swap %s to linear before it is fully '
                       'hydrated' % name)
        if before is not None:
            before()
        lv = self.lv_path(t)
        self.dm.reload(name, [dmsetup.linear_segment(
            0, self.dm.device_sectors(lv), lv)])

    def swapped(self, t):
        """True if the handle is loaded and maps no clone segment.

        (A finalization's swap to linear; a reboot takes the handle, and
        with it this answer.)  Any error reading it: False.
        """
        name = self.handle_name(t)
        try:
            if not self.dm.exists(name):
                return False
            table = self.dm.table(name)
        except Exception:
            return False
        return bool(table) and all(seg.target == 'linear' for seg in table)

    def written(self, t):
        """True if the clone may hold data the source does not have.

        In ``cloned`` hydration is off, so a region is hydrated only
        because the instance wrote (or discarded) it here.  Without a
        clone to ask (a reboot), the answer is yes: never assume a clone
        holds nothing.
        """
        name = self.handle_name(t)
        if not self.dm.exists(name):
            return True
        status = [s.clone for s in self.dm.status(name) if s.clone]
        return not status or status[0].hydrated_regions > 0

    def has_data(self, t):
        return self.vg.get_volume(t.lv_name) is not None

    def has_metadata(self, t):
        return self.meta_vg.get_volume(
            layout.metadata_lv_name(t.lv_name)) is not None

    def listed(self, t):
        """(data LV, metadata LV) of ``t``: True for each LVM lists here.

        LVM's own listing of the data and the metadata volume groups
        (privileged.vg_lv_names), never brick's get_volume, which takes
        a volume group not found (a PV not scanned yet after a reboot)
        for an LV not found: every step that removes, wipes, rolls back
        or gives up a copy on an LV's absence reads it here.  A group
        that cannot be listed raises LVMUnlisted.
        """
        return self.listed_lv(t.lv_name)

    def listed_lv(self, lv_name):
        """:meth:`listed` of the data LV ``lv_name`` and its metadata LV.

        (For an LV named otherwise than a move's: an old copy named
        after the volume when it was abandoned.)
        """
        names = {vg: self.lv_names(vg)
                 for vg in sorted({self.vg.vg_name, self.meta_vg.vg_name})}
        return (lv_name in names[self.vg.vg_name],
                layout.metadata_lv_name(lv_name)
                in names[self.meta_vg.vg_name])

    def metadata_listed(self, lv_name):
        """True if LVM lists the metadata LV of data LV ``lv_name`` here.

        The metadata group's own listing (see :meth:`listed`): what
        tells a partly copied LV, which only its clone may serve, from
        a whole one.  LVMUnlisted if LVM cannot list that group.
        """
        return layout.metadata_lv_name(lv_name) in self.lv_names(
            self.meta_vg.vg_name)

    def lv_names(self, vg):
        """The LVs of group ``vg`` as LVM lists them.

        LVMUnlisted if it cannot (privileged.vg_lv_names raises rather
        than answer none).
        """
        try:
            return privileged.vg_lv_names(
                vg, execute=self._execute, root_helper=self._root_helper)
        except Exception as exc:
            raise dmc_exception.LVMUnlisted(vg=vg, reason=exc) from exc

    def loaded(self, t):
        """True if the handle of ``t`` is loaded (a clone or linear)."""
        return self.dm.exists(self.handle_name(t))

    def open_count(self, t):
        """How many openers hold the handle of ``t`` (it must exist)."""
        return self.dm.open_count(self.handle_name(t))

    def holds_nothing(self, t):
        """True if LVM and the kernel positively show nothing of ``t`` here.

        No handle loaded, and LVM's own listing of the data and the
        metadata volume groups (privileged.vg_lv_names, which fails
        rather than answer "none" for a group it cannot read) names
        neither the data LV nor the metadata LV.  Not
        :meth:`has_data`: brick takes a volume group not found (a PV not
        scanned yet after a reboot) for an LV not found.  Any failure:
        False.
        """
        names = set()
        try:
            if self.dm.exists(self.handle_name(t)):
                return False
            for vg in sorted({self.vg.vg_name, self.meta_vg.vg_name}):
                names |= privileged.vg_lv_names(
                    vg, execute=self._execute, root_helper=self._root_helper)
        except Exception:
            LOG.warning('Cannot tell whether this node holds anything of '
                        'LV %s.', t.lv_name, exc_info=True)
            return False
        return not names & {t.lv_name, layout.metadata_lv_name(t.lv_name)}

    def lost_metadata(self, t):
        """True if the data LV is here but neither its clone nor metadata.

        (The metadata LV was removed, or its device failed, while the
        clone was not loaded: a reboot.)  Nothing tells any more which
        regions hold writes made here, and no clone can be built again.
        """
        return self.has_data(t) and not self.has_metadata(t) and \
            not self.dm.exists(self.handle_name(t))

    def metadata_lost(self, t):
        """The CloneMetadataLost error for move ``t`` on this node."""
        return dmc_exception.CloneMetadataLost(
            volume=t.volume_id, node=t.dest_node, lv=t.lv_name,
            meta=layout.metadata_lv_name(t.lv_name))

    def needs_rebuild(self, t):
        """True if the clone is gone (a reboot) while its metadata is not."""
        return not self.dm.exists(self.handle_name(t)) and \
            self.has_metadata(t)

    def remove_metadata(self, t):
        """Remove the metadata LV of ``t`` if LVM lists it here.

        LVM's own listing (:meth:`metadata_listed`): on a group it cannot
        list, LVMUnlisted, nothing done.  (Brick's lookup took such a
        group for "no metadata LV": a finalization went on to retire the
        source and clear the move, and the metadata LV left made the
        driver refuse the whole LV for good.)
        """
        if self.metadata_listed(t.lv_name):
            self.meta_vg.delete(layout.metadata_lv_name(t.lv_name))

    def tear_down(self, t, provider_auth, keep_data=False):
        """Remove everything the transfer built here (a rollback).

        The data LV goes (to be wiped) before the metadata LV: while a
        metadata LV is there nothing maps the partly hydrated data LV on
        its own (the driver's guard), so a crash in between never exposes
        it.  With ``keep_data`` the data LV stays: it is not the
        transfer's (see Destination.tear_down).

        Whether the data LV is here is LVM's own listing (:meth:`listed`),
        read before anything is removed: on a group LVM cannot list,
        LVMUnlisted with everything as it was.  (Brick's lookup took
        such a group for "no LVs": the clone and its session went, its
        LVs stayed unwiped, and the caller went on to end the move.)
        """
        data, _meta = self.listed(t)
        self.dm.remove(self.handle_name(t))
        self.disconnect_source(t, provider_auth)
        if data and not keep_data:
            self.discard(t.lv_name)
        self.remove_metadata(t)
