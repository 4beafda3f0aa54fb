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

"""What a node does about a move after a restart, a reboot or an abort.

:func:`plan` is a pure function from what is recorded (the move), what the
database says (where the volume lives, who is attached) and what this
node's kernel and LVM show (the clone's LVs, whether its table is still
loaded) to the one action to take; :class:`Recovery` gathers those facts
and carries the action out.  Service start runs it for every move that
touches this node; the hydration monitor runs it for a move it finds
aborted.
"""

import dataclasses

from oslo_log import log as logging

from cinder import exception
from cinder import objects
from cinder.volume import volume_utils

from cinder_dmclone import attachments
from cinder_dmclone import evidence
from cinder_dmclone import exception as dmc_exception
from cinder_dmclone import layout
from cinder_dmclone import move
from cinder_dmclone import source as source_side

LOG = logging.getLogger(__name__)

#: Nothing to do here (the move is the other node's business).
NOTHING = 'nothing'
#: Source: the move never completed; ask the destination to remove its
#: side, drop the export, forget the move (under the volume's lock, only
#: in ABANDONABLE states).
ABANDON = 'abandon'
#: Source, the record still names it but the move is committed (the
#: database lost the write that points the record at the destination):
#: the destination's clone holds the instance's writes, and it points
#: the record at itself when it finalizes.  Logged, nothing done.
LEAVE_TO_DEST = 'leave to destination'
#: The states of a move that never committed: the source may end it.
ABANDONABLE = (move.PREPARING, move.CLONED, move.ABORTED)
#: Destination: the source gave the move up; remove what was built here.
DROP_ABORTED = 'drop aborted'
#: Destination, ``preparing``: tear down the half-built clone; the source
#: (or its recovery) owns the record and clears it.
TEAR_DOWN = 'tear down'
#: Destination, ``preparing`` while the volume record names it: the move
#: was committed and its record set back by a stale whole save of the
#: admin metadata; roll it forward as its clone tells
#: (Destination.roll_forward), then resume it as that state says; if
#: this node marked its rollback and positively holds nothing of it (a
#: rollback cut short after its teardown), finish that rollback.
ROLL_FORWARD = 'roll forward'
#: Destination, ``cloned``: the live migration failed (or a rollback was
#: cut short): roll back, unless the clone took writes.
ROLL_BACK = 'roll back unless written'
#: Destination: the clone's table is gone; rebuild it (hydration as the
#: state says); if the lost detach said commit, the monitor commits once
#: the source confirms its copy closed (Destination.commit_pending).
REBUILD = 'rebuild'
#: Destination, ``finalizing``, table still loaded: finalize again.
FINALIZE = 'finalize'
#: Destination: the data LV of a committed move is gone (its delete was
#: interrupted): report, touch nothing.
REPORT_DELETED = 'report interrupted delete'
#: Source, the record names the destination: it still reads the regions
#: it has not copied from here, until it retires this copy.  A reboot took
#: LIO's targets and the handle: rebuild the handle, restore the export.
REEXPORT = 'export again'
#: Destination, ``source_lost``: an operator is ending the move over its
#: lost source (cinder_dmclone.lost_source); only that command finishes
#: it: report, touch nothing.
AWAIT_OPERATOR = 'await operator'
#: Destination, a move that reads its source, while LVM cannot list the
#: volume groups here (a PV not scanned yet after a reboot): which LVs are
#: here is unknown, so nothing is rolled back, finalized or rebuilt; the
#: move is kept as it is and looked at again after each monitor tick
#: (Recovery.retry_rebuilds).
AWAIT_LVM = 'await LVM'
#: Either side: this node's own mark names another move than the record
#: (a stale whole save replaced the record of the move it takes part in)
#: and the record could not be written back: nothing is done on the
#: record's word (a source whose destination reads its copy exports it
#: again), logged.  Decided before :func:`plan`, from the mark.
KEEP_CONTRADICTED = 'keep contradicted'
#: The states in which the destination of a move still reads the source.
READS_SOURCE = (move.CLONED, move.HYDRATING, move.FINALIZING)

# What a start does about this node's mark as the destination of a move
# of a volume that no longer exists (:func:`plan_deleted`): no record
# describes that move any more, only the mark.
#: Its clone's LVs are here (or what a cut-short teardown of them left):
#: tear it down, the data LV wiped, and forget the mark.
DROP_DELETED = 'drop clone of deleted volume'
#: A live volume, another mark of this node or a live move record names
#: its data LV: that LV may be another volume's; nothing is touched.
KEEP_NAMED = 'keep LV named elsewhere'
#: Its data LV is here without its metadata LV: no move leaves that (see
#: Destination.old_copy), so it may be an old copy; left, and reported
#: as any LV of a deleted volume (Recovery.report_lvs_of_deleted_volumes).
KEEP_OLD_COPY = 'keep old copy'


@dataclasses.dataclass(frozen=True)
class Facts:
    """What recovery looks at, besides the move record itself."""

    #: The move's source is this node, and the volume record names it.
    source_here: bool
    #: The move's destination is this node.
    dest_here: bool
    #: Active attachments on the source's names and on this node's.
    on_source: int = 0
    on_dest: int = 0
    #: The clone's data LV exists here; its clone table is not loaded
    #: while its metadata LV exists.  For a move in READS_SOURCE, as
    #: LVM's own listing says (Clones.listed).
    has_data: bool = True
    needs_rebuild: bool = False
    #: LVM could not list the volume groups here (read for a move in
    #: READS_SOURCE only): has_data and needs_rebuild tell nothing.
    lvm_unlisted: bool = False
    #: The move's source is this node, and the volume record names the
    #: destination (the move went ahead).
    source_away: bool = False
    #: The volume record names the move's destination (Side.
    #: names_destination); read for a move ``preparing`` only: one that
    #: was committed, then set back by a stale save.
    dest_named: bool = False


@dataclasses.dataclass(frozen=True)
class Action:
    """What to do, and for REBUILD how."""

    name: str
    hydrate: bool = False
    commit: bool = False
    finalize: bool = False


def plan(t, facts):
    """The action recovery takes for move ``t`` given ``facts``."""
    if facts.source_here:
        return Action(ABANDON if t.state in ABANDONABLE else LEAVE_TO_DEST)
    if facts.source_away and not facts.dest_here:
        return Action(REEXPORT if reads_source(t, facts.dest_named)
                      else NOTHING)
    if not facts.dest_here:
        return Action(NOTHING)
    if t.state == move.SOURCE_LOST:
        return Action(AWAIT_OPERATOR)
    if t.state == move.ABORTED:
        return Action(DROP_ABORTED)
    if t.state == move.PREPARING:
        return Action(ROLL_FORWARD if facts.dest_named else TEAR_DOWN)
    if facts.lvm_unlisted:
        return Action(AWAIT_LVM)
    commit = False
    if t.state == move.CLONED:
        # The detach a crash may have lost decides: none left on the
        # source means the instance runs here (commit); none here while
        # the source still has one means the migration failed.
        rollback = bool(facts.on_source and not facts.on_dest)
        commit = not facts.on_source
        if rollback or not facts.has_data:
            # (No data LV: a rollback's teardown had begun.)
            return Action(ROLL_BACK)
    if t.state == move.FINALIZING and not facts.needs_rebuild:
        return Action(FINALIZE)
    if not facts.has_data:
        return Action(REPORT_DELETED)
    return Action(REBUILD, hydrate=t.state != move.CLONED,
                  commit=commit, finalize=t.state == move.FINALIZING)


def plan_deleted(listed, named_elsewhere):
    """What a start does about a destination mark of a deleted volume.

    ``listed``: (data LV, metadata LV) of the mark's move, True for each
    LVM lists here; None while LVM cannot list the groups (AWAIT_LVM:
    which LVs are here is unknown).  ``named_elsewhere``: a live volume,
    another mark of this node or a live move record names the move's
    data LV.  Only what the mark's move built goes: a build creates the
    metadata LV before the data LV and a teardown removes the data LV
    first, so a data LV alone is no part of a clone, while a metadata LV
    alone (or nothing) is a teardown cut short.
    """
    if listed is None:
        return Action(AWAIT_LVM)
    if named_elsewhere:
        return Action(KEEP_NAMED)
    data, meta = listed
    if data and not meta:
        return Action(KEEP_OLD_COPY)
    return Action(DROP_DELETED)


def reads_source(t, dest_named):
    """True if move ``t``'s destination reads its source's copy.

    Every region it has not copied, until it retires that copy: in the
    READS_SOURCE states, and ``preparing`` when the volume record names
    the destination (``dest_named``): a committed move set back by a
    stale save, which its destination rolls forward.
    """
    return t.state in READS_SOURCE or (t.state == move.PREPARING
                                       and dest_named)


def volumes_touching(ctxt, host, node_names):
    """The volumes whose moves recovery looks at on this node.

    Those whose record names this service's ``host``, and those whose
    move names one of ``node_names`` as its source or its destination: a
    volume moving away names its destination, one being prepared here
    still names its source.  They are found by their move record (admin
    metadata), never from an LV's name: a volume's LV is not always named
    after it (a migrated volume's ``_name_id``).  (Cinder's ``metadata``
    filter also matches user metadata; only the admin metadata is read
    as a move afterwards.)
    """
    volumes = {v.id: v for v in objects.VolumeList.get_all_by_host(
        ctxt, host)}
    for key in ('dest_node', 'source_node'):
        for volume in volumes_naming(ctxt, key, node_names):
            volumes.setdefault(volume.id, volume)
    return list(volumes.values())


def volumes_naming(ctxt, key, node_names):
    """Volumes whose move names one of ``node_names`` as ``key``.

    ``key`` is ``source_node``, ``dest_node`` (or ``lost_source``, the
    node a move was abandoned over: see Recovery.report_lost_copies).  A
    candidate list:
    Cinder's ``metadata`` filter matches user metadata too, so the
    caller reads the move itself before acting on it.
    """
    for name in sorted(node_names):
        yield from objects.VolumeList.get_all(
            ctxt, filters={'metadata': {move.KEY_PREFIX + key: name}})


def _may_be_old_copy(lv_name):
    """True for a data LV named like a volume's (no dm-clone LV of ours)."""
    return (volume_utils.extract_id_from_volume_name(lv_name) is not None
            and layout.lv_name_from_metadata_lv(lv_name) is None
            and not layout.is_retiring_lv(lv_name))


def volumes_with_old_copies(ctxt, node_names, lv_names, touching):
    """The volumes whose record says this node may hold an old copy.

    A move away from this node that an operator abandoned as lost
    (``cinder-dmclone move abandon-source``) left the volume's old LV
    here, and its record names it: under a key of this node's
    (:func:`cinder_dmclone.move.old_copy_key`, kept when a later abandon
    elsewhere replaces the latest loss record), and in the latest loss
    record (``dmclone_lost_source``, also as earlier releases wrote it).
    ``lv_names`` are this node's data LVs, ``touching`` the volumes whose
    record or move names this node (:func:`volumes_touching`): every
    other LV named like a volume is looked up by its node key, one query
    each (a node holds few such LVs).  A volume in ``touching`` is never
    one: it lives or moves here, and its LV here is no old copy whatever
    a key outliving the copy's removal says.  A candidate list, as
    :func:`volumes_naming` gives.
    """
    taken = {v.name for v in touching}
    live = {v.id for v in touching}
    found = {volume.id: volume for volume in volumes_naming(
        ctxt, 'lost_source', node_names) if volume.id not in live}
    for lv in sorted(set(lv_names) - taken):
        if not _may_be_old_copy(lv):
            continue
        for name in sorted(node_names):
            for volume in objects.VolumeList.get_all(ctxt, filters={
                    'metadata': {move.old_copy_key(name): lv}}):
                if volume.id not in live:
                    found.setdefault(volume.id, volume)
    return [found[vid] for vid in sorted(found)]


def lvs_of_deleted_volumes(ctxt, lv_names, touching):
    """{LV: volume id} of this node's LVs named like a deleted volume.

    An old copy kept here (by a rollback whose clone lost its metadata
    LV, or an abandon as lost) outlives its volume's delete on the node
    the volume lived on: no record names it any more, so the keys of
    :func:`volumes_with_old_copies` cannot find it.  ``lv_names`` are
    this node's data LVs, ``touching`` the volumes whose record or move
    names this node: every other LV named like a volume is looked up,
    one read each (a node holds few such LVs).  The id in an LV's name
    is not always its volume's: a volume whose ``_name_id`` holds it
    (after Cinder's generic migration of an in-use volume) names its LV
    after it, while the volume of that id is deleted
    (:func:`_volume_named_after`).
    """
    taken = {v.name for v in touching}
    found = {}
    for lv in sorted(set(lv_names) - taken):
        if not _may_be_old_copy(lv):
            continue
        volume_id = volume_utils.extract_id_from_volume_name(lv)
        if not _volume_named_after(ctxt, volume_id):
            found[lv] = volume_id
    return found


def volume_of_lv(ctxt, lv_name):
    """The volume whose LV is named ``lv_name``, or None.

    A volume's LV is named after its ``_name_id`` when it has one (after
    Cinder's generic migration of an in-use volume), else after its id:
    the id in the LV's name is looked up as both, and only a volume
    whose ``name`` is exactly ``lv_name`` is its.
    """
    volume_id = volume_utils.extract_id_from_volume_name(lv_name)
    if volume_id is None:
        return None
    candidates = list(objects.VolumeList.get_all(
        ctxt, filters={'_name_id': volume_id}))
    try:
        candidates.append(objects.Volume.get_by_id(ctxt, volume_id))
    except exception.VolumeNotFound:
        pass
    return next((v for v in candidates if v.name == lv_name), None)


def _volume_named_after(ctxt, volume_id):
    """True if a volume has the id ``volume_id``, or its ``_name_id``.

    Such a volume's LV is named after ``volume_id`` (or was, for the
    first: its LV keeps another name once it has a ``_name_id``): an LV
    of that name is no LV of a deleted volume.
    """
    try:
        objects.Volume.get_by_id(ctxt, volume_id)
        return True
    except exception.VolumeNotFound:
        pass
    return bool(objects.VolumeList.get_all(
        ctxt, filters={'_name_id': volume_id}))


def _volume_exists(ctxt, volume_id):
    """True unless volume ``volume_id`` is not found (deleted).

    Another mark naming a deleted volume's LV keeps that LV only while
    its own volume lives: two marks of deleted volumes would otherwise
    keep each other's clone, never wiped.  Any other error raises.
    """
    try:
        objects.Volume.get_by_id(ctxt, volume_id)
    except exception.VolumeNotFound:
        return False
    return True


class Recovery(object):
    """Carries out :func:`plan` for the moves touching this node."""

    def __init__(self, source, destination):
        self.source = source
        self.destination = destination
        #: volume id -> the move whose clone a start could not build
        #: again (its source did not answer); the monitor tries again
        #: (retry_rebuilds) while the record still describes that move.
        self.pending_rebuild = {}
        #: volume id -> the move from here a start could not abandon (its
        #: lock could not be taken, or the abandon failed); the monitor
        #: tries again (retry_abandons) while the record still describes
        #: that move, never committed.
        self.pending_abandon = {}
        #: volume id -> the move of a deleted volume whose clone here a
        #: start could not look at (LVM could not list the groups); the
        #: monitor looks again (retry_deleted).
        self.pending_deleted = {}

    def recover(self, volumes, metadata_lvs):
        """Resume, finish or roll back every move touching this node.

        ``volumes`` are the volumes whose record names this node or whose
        move does; ``metadata_lvs`` the metadata LV names present here.
        Leftovers that match no move are reported, never deleted.  The
        volumes this node's own marks name besides (a stale save removed
        their record) are looked at for their export only
        (:meth:`_export_marked_elsewhere`).

        Runs at start without the volumes' locks (but for an abandon,
        see :meth:`_abandon`), unlike every later caller of :meth:`run`:
        the service's RPC server does not serve yet, so no API request
        and no step of the other node reaches it, and a start must not
        depend on the lock service being up.  What
        the other node may do meanwhile under its own lock (a rollback
        or a finalization, whose step to this node then times out) meets
        a compare-and-set here (``Store.transition``, ``clear`` of this
        very move) or an idempotent re-export.
        """
        known = set()
        for volume in volumes:
            try:
                t = move.Move.from_metadata(volume.id, volume.admin_metadata)
            except move.MoveStateInvalid:
                LOG.exception('Not recovering volume %s.', volume.id)
                continue
            if t is None:
                self._drop_leftover_export(volume)
                t = self._restored_at_start(volume)
                if t is None:
                    self._export_by_mark(volume, None)
                    continue
            known.add(t.lv_name)
            if self.destination.is_dest(t):
                self.destination.lv_volumes[t.lv_name] = volume.id
            try:
                self.run(volume, t)
            except Exception:
                LOG.exception('Recovering the transfer of volume %s failed.',
                              volume.id)
        known |= self._export_marked_elsewhere(
            {volume.id for volume in volumes})
        for name in metadata_lvs:
            lv = layout.lv_name_from_metadata_lv(name)
            if lv and lv not in known:
                LOG.warning('Metadata LV %s matches no transfer into this '
                            'node; left in place for an operator to check.',
                            name)

    def _restored_at_start(self, volume):
        """A move into this node whose record a stale save removed, or None.

        The copy saved had no move at all, and this node's own mark says
        it is the destination of one (:meth:`Destination.restore_record
        <cinder_dmclone.destination.Destination.restore_record>`): its
        record is written back, to be recovered as any other.
        """
        if self.destination.contradiction(volume.id, None) is None:
            return None
        try:
            return self.destination.restore_record(volume, None)
        except Exception:
            LOG.exception('Volume %s: could not write back the record of '
                          'the move into this node.', volume.id)
            return None

    def _export_by_mark(self, volume, t):
        """At start: the export a move from here reads; never raises.

        (:meth:`Source.export_by_mark
        <cinder_dmclone.source.Source.export_by_mark>`.)  A failure is
        logged: the destination's reads of what it has not
        copied fail until the next start, as with any export not made.
        """
        try:
            self.source.export_by_mark(volume, t)
        except Exception:
            LOG.exception('Volume %s: could not export again the copy '
                          'that a move from here reads.', volume.id)

    def _export_marked_elsewhere(self, seen):
        """At start: this node's marks of volumes no record led to.

        A stale save of a copy that held no move removes the record of a
        move from this node while the volume record names its
        destination: :func:`volumes_touching` then finds no reason to
        look at the volume here, and only this node's own mark (as that
        move's source) tells that a destination still reads from here.
        ``seen``: the ids of the volumes recovered already.  Nothing but
        the export is done for these (:meth:`_export_by_mark`): their
        record, if any, names no move of this node.

        A mark whose volume is not found (VolumeNotFound alone: any other
        error leaves everything) outlived the volume's delete: as the
        destination, the clone its move built here goes
        (:meth:`_drop_deleted`).  Returns the data LVs of those clones.
        """
        dropped = set()
        for volume_id in self.source.marked_volume_ids():
            if volume_id in seen:
                continue
            try:
                volume = objects.Volume.get_by_id(self.source.ctxt(),
                                                  volume_id)
                t = move.Move.from_metadata(volume.id, volume.admin_metadata)
            except exception.VolumeNotFound:
                lv = self._drop_deleted(volume_id)
                if lv is not None:
                    dropped.add(lv)
                continue
            except Exception:
                LOG.exception('Volume %s: its move record cannot be read; '
                              'its export is not made again.', volume_id)
                continue
            self._export_by_mark(volume, t)
        return dropped

    def _drop_deleted(self, volume_id):
        """The clone of deleted volume ``volume_id`` that this node marks.

        This node's mark names it the destination of a move that no
        record describes any more: the volume was deleted while this
        node was down (its source gave the move up, and the abort never
        reached it).  The mark's move's clone goes, its data LV wiped as
        every teardown wipes it (Destination.drop_deleted), as
        :func:`plan_deleted` says.  Never raises: a failure (a database
        error above all) is logged and leaves everything.  Returns the
        data LV if it went, else None.
        """
        part = self.destination.evidence.read(volume_id) \
            if self.destination.evidence is not None else None
        if part is None or part.role != evidence.DESTINATION:
            self.pending_deleted.pop(volume_id, None)
            return None     # (no clone of ours: the mark is inert)
        t = part.move
        try:
            listed = self._listed(t)
            named = listed is not None and self._named_elsewhere(
                self.destination.ctxt(), volume_id, t)
            action = plan_deleted(listed, named)
            self._act_deleted(action, volume_id, t, named)
        except Exception:
            self.pending_deleted.pop(volume_id, None)
            LOG.exception('Volume %(vol)s is deleted, and this node still '
                          'holds its mark as the destination of a move; '
                          'nothing of that move is removed here (LV %(lv)s '
                          'stays, if it is here) until the next start.',
                          {'vol': volume_id, 'lv': t.lv_name})
            return None
        return t.lv_name if action.name == DROP_DELETED else None

    def _listed(self, t):
        """:meth:`Clones.listed` of ``t``; None while LVM cannot list."""
        try:
            return self.destination.clones.listed(t)
        except dmc_exception.LVMUnlisted as exc:
            LOG.warning('Volume %(vol)s: %(why)s',
                        {'vol': t.volume_id, 'why': exc.msg})
            return None

    def _named_elsewhere(self, ctxt, volume_id, t):
        """What names move ``t``'s data LV besides the deleted volume.

        A live volume whose LV it is (its ``name``, from its id or its
        ``_name_id``: after Cinder's generic migration a live volume
        names its LV after the deleted temporary volume's id), a live
        move record whose LV it is, or another mark of this node naming
        it whose volume exists.  A name no volume could have (another
        volume name template) is taken as named.  None if nothing does.
        A database error raises.
        """
        lv = t.lv_name
        if volume_utils.extract_id_from_volume_name(lv) is None:
            return 'a name not made by the volume name template'
        live = volume_of_lv(ctxt, lv)
        if live is not None:
            return 'volume %s' % live.id
        for volume in volumes_naming(ctxt, 'lv_name', {lv}):
            try:
                other = move.Move.from_metadata(volume.id,
                                                volume.admin_metadata)
            except move.MoveStateInvalid:
                return 'the unreadable move record of volume %s' % volume.id
            if other is not None and other.lv_name == lv:
                return 'the move record of volume %s' % volume.id
        for other_id in self.source.marked_volume_ids():
            part = None if other_id == volume_id \
                else self.destination.evidence.read(other_id)
            if (part is not None and part.move.lv_name == lv
                    and _volume_exists(ctxt, other_id)):
                return 'this node\'s mark of volume %s' % other_id
        return None

    def _act_deleted(self, action, volume_id, t, named):
        """Carry out :func:`plan_deleted`'s ``action`` for move ``t``.

        ``named``: what else names its data LV (KEEP_NAMED).
        """
        if action.name == AWAIT_LVM:
            self.pending_deleted[volume_id] = t
            LOG.warning('Volume %(vol)s is deleted, and this node holds its '
                        'mark as the destination of a move, but LVM cannot '
                        'list its volume groups here: looked at again after '
                        'each monitor tick.', {'vol': volume_id})
            return
        self.pending_deleted.pop(volume_id, None)
        if action.name == DROP_DELETED:
            self.destination.drop_deleted(volume_id, t)
        elif action.name == KEEP_NAMED:
            LOG.warning('Volume %(vol)s is deleted, and this node holds its '
                        'mark as the destination of a move whose LV %(lv)s '
                        'is also named by %(other)s: nothing is removed '
                        'here; check with "cinder-dmclone status" (see the '
                        'operations guide).',
                        {'vol': volume_id, 'lv': t.lv_name,
                         'other': named})
        elif action.name == KEEP_OLD_COPY:
            LOG.warning('Volume %(vol)s is deleted, and this node holds its '
                        'mark as the destination of a move; LV %(lv)s here '
                        'has no metadata LV beside it, so that move did '
                        'not build it (an old copy?): left in place.',
                        {'vol': volume_id, 'lv': t.lv_name})

    def retry_deleted(self):
        """Look again at the clones of deleted volumes (after each tick).

        Those a start could not look at, LVM unable to list the groups
        then (:meth:`_drop_deleted`): under the volume's lock, never
        waiting for it, the volume and the mark read again.
        """
        for volume_id in sorted(self.pending_deleted):
            with move.lock_if_free(volume_id) as locked:
                if locked:
                    self._retry_deleted(volume_id)

    def _retry_deleted(self, volume_id):
        try:
            objects.Volume.get_by_id(self.destination.ctxt(), volume_id)
        except exception.VolumeNotFound:
            self._drop_deleted(volume_id)
            return
        except Exception:
            LOG.warning('Volume %s: cannot tell whether it is deleted; '
                        'looked at again after the next monitor tick.',
                        volume_id, exc_info=True)
            return
        self.pending_deleted.pop(volume_id, None)   # (not deleted)

    def _drop_leftover_export(self, volume):
        """At start: the ACL a move from here that is over left.

        See :meth:`Source.drop_leftover_export
        <cinder_dmclone.source.Source.drop_leftover_export>`: before
        Cinder's start restores this node's exports (``ensure_export``),
        with the destination's ACL from LIO's saved configuration.  Under
        the volume's lock; without it (the coordination backend is down),
        if it fails, or if the ACL may still be there (LIO's saved
        targets could not be restored), the monitor tries again.
        """
        if move.Store.move_export_of(volume.admin_metadata) is None:
            return
        try:
            with move.lock_unless_down(volume.id) as locked:
                if locked and self.source.drop_leftover_export(
                        volume.id, restore=True):
                    return
        except Exception:
            LOG.exception('Volume %s: could not remove the ACL of a move '
                          'that is over from its export.', volume.id)
        self.source.leftover_exports.add(volume.id)

    def report_lost_copies(self, volumes):
        """At start: old copies here of moves abandoned as lost.

        This node was the source of a move an operator ended because the
        node was taken for lost (``cinder-dmclone move abandon-source``);
        the volume lives elsewhere now, with the regions never copied
        zeroed, and nothing describes the copy left here.  It is never
        used, exported or removed automatically (it may hold the only
        copy of those regions): said at every start while its LV is
        here, for an operator to remove by hand -- also after a later
        abandon of the volume over another node.  ``volumes`` are those
        of :func:`volumes_with_old_copies`.
        """
        try:
            for volume in volumes:
                self._report_lost_copy(volume)
        except Exception:
            LOG.warning('Could not look for old copies of abandoned moves.',
                        exc_info=True)

    def report_lvs_of_deleted_volumes(self, lvs):
        """At start: LVs here named like a volume that no longer exists.

        ``lvs`` as :func:`lvs_of_deleted_volumes` gives.  Most likely an
        old copy a rollback or an abandon kept here, never wiped: said at
        every start while it is here, never removed automatically.
        """
        for lv in sorted(lvs):
            LOG.warning('LV %(lv)s here is named like volume %(vol)s, which '
                        'no longer exists: most likely an old copy kept by '
                        'a rolled-back move (its clone had lost its '
                        'metadata LV) or a move abandoned as lost, never '
                        'wiped. Copy out what is needed, then wipe and '
                        'remove it by hand (see the operations guide).',
                        {'lv': lv, 'vol': lvs[lv]})

    def _report_lost_copy(self, volume):
        """Warn of ``volume``'s old copy here, unless it lives or moves here.

        The keys naming an old copy outlive its removal: an LV of a
        volume whose record or current move names this node is the
        volume itself (or a move's source), never to be removed.
        """
        copies = move.Store.old_copies_of(volume.admin_metadata)
        if self.source.lives_here(volume) or self._moves_here(volume):
            return
        loss = move.Store.loss_of(volume.admin_metadata)
        for node in sorted(self.source.node_names & set(copies)):
            lv = copies[node]
            if self.source.wiper.vg.get_volume(lv) is None:
                continue
            if loss.get('lost_source') == node:
                LOG.warning(
                    'Volume %(vol)s moved away from this node and its '
                    'move was abandoned at %(at)s as if this node were '
                    'lost (%(n)s regions never copied, listed on its '
                    'destination in %(file)s). Its old copy is still '
                    'here, unused: LV %(lv)s (not wiped) and maybe the '
                    'iSCSI target %(target)s in LIO\'s saved '
                    'configuration. Copy back what is needed, then '
                    'remove them by hand (see the operations guide).',
                    {'vol': volume.id, 'at': loss.get('lost_at'),
                     'n': loss.get('lost_regions'),
                     'file': loss.get('lost_ranges_file'), 'lv': lv,
                     'target': loss.get('lost_source_target')})
            elif not loss:
                LOG.warning(
                    'Volume %(vol)s lives on %(host)s; LV %(lv)s here is '
                    'an old copy of it kept (not wiped) when a move here '
                    'was rolled back after its clone lost its metadata LV '
                    '(or by an abandon as lost). If the instance never '
                    'ran here, wipe and remove it; else copy out what is '
                    'needed first (see the operations guide).',
                    {'vol': volume.id, 'host': volume.host, 'lv': lv})
            else:
                LOG.warning(
                    'Volume %(vol)s moved away from this node and its '
                    'move was abandoned as if this node were lost; a '
                    'later abandon (of %(later)s, at %(at)s) replaced the '
                    'details of that loss in its record. Its old copy is '
                    'still here, unused: LV %(lv)s (not wiped) and maybe '
                    'its iSCSI target in LIO\'s saved configuration. '
                    'Copy back what is needed, then remove them by hand '
                    '(see the operations guide).',
                    {'vol': volume.id, 'later': loss.get('lost_source'),
                     'at': loss.get('lost_at'), 'lv': lv})

    def _moves_here(self, volume):
        """True if the volume's move names this node (or is unreadable)."""
        try:
            t = move.Move.from_metadata(volume.id, volume.admin_metadata)
        except move.MoveStateInvalid:
            return True         # unsure: advise no removal
        return self.source.is_source(t) or self.destination.is_dest(t)

    def resolve_aborted(self, volume_id, t):
        """The monitor found move ``t`` aborted: act if it still is.

        Under the volume's lock, and only if the record still describes
        that move: a retried one may have taken the lock first and be
        building right now.
        """
        with move.lock_if_free(volume_id) as locked:
            if not locked:
                return      # the next tick finds it again
            current = self.destination.load_any(volume_id)
            if t.same_move(current) and current.state == move.ABORTED:
                self.run(objects.Volume.get_by_id(
                    self.destination.ctxt(), volume_id), current)

    def retry_aborts(self):
        """End the aborted moves the monitor cannot see (after each tick).

        The source gave a move up and asked this node to remove what it
        built; if the removal failed here (LVM could not list the group
        for a moment, say), or the source never had the answer (an RPC
        timeout), the source recorded the move ``aborted``.  The monitor
        finds an aborted move through its loaded clone, and the build
        may not have got that far, so the record stayed until a service
        restarted (review 22 #3).  Resolved as the monitor resolves one
        (:meth:`resolve_aborted`) once the source has recorded it; while
        the source has not decided yet, looked at again; forgotten once
        the record is dropped, describes another move, or the volume is
        gone.  Once a tick: a resolution that waits for LVM is this
        method's to try again, not a rebuild's.
        """
        owed = self.destination.abort_owed
        for volume_id, secret in sorted(owed.items()):
            try:
                t = self.destination.load_any(volume_id)
            except exception.VolumeNotFound:
                t = None
            except move.MoveStateInvalid:
                LOG.exception('Not ending the aborted move of volume %s: '
                              'its record cannot be read.', volume_id)
                t = None
            if t is None or t.secret != secret or \
                    t.state not in move.UNCOMMITTED:
                owed.pop(volume_id, None)
            elif t.state == move.ABORTED and self.destination.is_dest(t):
                self._resolve_owed(volume_id, t)

    def _resolve_owed(self, volume_id, t):
        try:
            self.resolve_aborted(volume_id, t)
        except exception.VolumeNotFound:
            self.destination.abort_owed.pop(volume_id, None)
        except Exception:
            LOG.warning('Removing what the aborted move of volume %s '
                        'built here failed; trying again after the next '
                        'monitor tick.', volume_id, exc_info=True)
        finally:
            # (Tried again by retry_aborts, whatever waits.)
            self.pending_rebuild.pop(volume_id, None)

    def retry_rebuilds(self):
        """Build again the clones a start could not (after each tick).

        Both nodes lost power and this one's service started first: its
        recovery could not log in to the source's export (to rebuild the
        clone, or to roll back, which needs it), and without the clone
        the volume's instance cannot attach it here.  Tried again only
        while the source's service reports itself up and rests no more
        after the last failed try (see :meth:`Destination.rest_source`):
        a login to a dead portal can take minutes, and the tick waits
        for it.  Under the volume's lock, never waiting for it; the plan
        is made again from the record as it is now, as a start would.
        """
        ctxt = self.destination.ctxt()
        for volume_id, t in sorted(self.pending_rebuild.items()):
            try:
                self._retry_one(ctxt, volume_id, t)
            except Exception:
                # (One unreadable record must not hold up the others.)
                LOG.exception('Retrying the transfer of volume %s failed.',
                              volume_id)

    def _retry_one(self, ctxt, volume_id, t):
        if not self._still_pending(volume_id, t):
            return
        if self.destination.source_resting(t) or \
                not source_side.service_is_up(ctxt, t.source_host):
            return
        with move.lock_if_free(volume_id) as locked:
            if locked and self._still_pending(volume_id, t):
                self._retry_rebuild(ctxt, volume_id)

    def _still_pending(self, volume_id, t):
        """True if the record still describes the move to rebuild.

        Deleted, rolled back, or replaced by a later move: dropped.
        """
        try:
            current = self.destination.load_any(volume_id)
        except exception.VolumeNotFound:
            current = None
        if self.destination.is_dest(current) and t.still(current):
            return True
        self.pending_rebuild.pop(volume_id, None)
        return False

    def _retry_rebuild(self, ctxt, volume_id):
        dest = self.destination
        try:
            volume = objects.Volume.get_by_id(ctxt, volume_id)
        except exception.VolumeNotFound:
            self.pending_rebuild.pop(volume_id, None)
            return
        t = dest.load_any(volume_id)
        try:
            self.run(volume, t)
        except dmc_exception.SourceUnreachable as exc:
            LOG.warning('Transfer of volume %(vol)s still waits for its '
                        'source (%(why)s); trying again in %(rest)d s.',
                        {'vol': volume_id, 'why': exc,
                         'rest': dest.PEER_REST})
        except Exception:
            LOG.exception('Recovering the transfer of volume %s failed; '
                          'not trying again.', volume_id)

    def facts(self, volume, t):
        dest = self.destination
        source_here = self.source.is_source(t) and \
            self.source.lives_here(volume)
        if source_here or not dest.is_dest(t) or t.state != move.CLONED:
            on_source = on_dest = 0
        else:
            current = attachments.current(volume)
            on_source = attachments.on(volume, t.source_names, current)
            on_dest = attachments.on(volume, dest.node_names, current)
        dest_here = dest.is_dest(t)
        return Facts(
            source_here=source_here, dest_here=dest_here,
            source_away=self.source.is_source(t) and not source_here,
            dest_named=(t.state == move.PREPARING
                        and dest.names_destination(volume, t)),
            on_source=on_source, on_dest=on_dest,
            **self._lv_facts(t, dest_here))

    def _lv_facts(self, t, dest_here):
        """has_data, needs_rebuild and lvm_unlisted of move ``t`` here.

        For a move that reads its source, whose "no data LV" rolls it
        back and whose "no metadata LV" finalizes it, from LVM's own
        listing (Clones.listed): brick's lookup takes a volume group
        not found (a PV not scanned yet after a reboot) for no LV.
        """
        clones = self.destination.clones
        if not (dest_here and t.state in READS_SOURCE):
            return {'has_data': dest_here and clones.has_data(t),
                    'needs_rebuild': dest_here and clones.needs_rebuild(t)}
        try:
            data, meta = clones.listed(t)
        except dmc_exception.LVMUnlisted as exc:
            LOG.warning('Volume %(vol)s: %(why)s',
                        {'vol': t.volume_id, 'why': exc.msg})
            return {'lvm_unlisted': True}
        return {'has_data': data,
                'needs_rebuild': meta and not clones.loaded(t)}

    def run(self, volume, t):
        """Take the action :func:`plan` gives for ``t`` on this node.

        An action here that needs the source's export and cannot log in
        to it (a rebuild, or a rollback, which rebuilds the clone to see
        whether it took writes) waits for the source: the monitor tries
        again (:meth:`retry_rebuilds`).  Any other outcome ends the wait.

        First, a record that this node's own mark contradicts is written
        back if it can be, and recovered as written back; else kept
        (:meth:`_contradicted`).
        """
        part = self.destination.contradiction(volume.id, t)
        if part is not None:
            restored = self.destination.restore_record(volume, t)
            if restored is None:
                return self._contradicted(volume, t, part)
            t = restored
        return self._run_plan(volume, t)

    def _run_plan(self, volume, t):
        """:meth:`run`'s action from :func:`plan`, once the record stands."""
        action = plan(t, self.facts(volume, t))
        try:
            self._act(action, volume, t)
        except dmc_exception.LVMUnlisted as exc:
            # (Read again by the action itself, which did nothing.)
            LOG.warning('Volume %(vol)s: %(why)s',
                        {'vol': volume.id, 'why': exc.msg})
            action = Action(AWAIT_LVM)
        except dmc_exception.SourceUnreachable:
            # (Both nodes lost power and this one came back first: the
            # source's export is not there yet.)
            self.pending_rebuild[volume.id] = t
            self.destination.rest_source(t)
            raise
        except Exception:
            # (This node's own failure, a lost metadata LV say: waiting
            # for the source would not help.)
            self.pending_rebuild.pop(volume.id, None)
            raise
        if action.name == AWAIT_LVM:
            self.pending_rebuild[volume.id] = t
        else:
            self.pending_rebuild.pop(volume.id, None)
        return action

    def _contradicted(self, volume, t, part):
        """KEEP_CONTRADICTED: nothing on record ``t``'s word; said once.

        This node's mark says it is ``part``: as the source of a move
        committed and not finished (Source.read_by_committed_move), that
        destination reads every region it has not copied from here, so
        the export is made again as REEXPORT does (a reboot took it).
        """
        self.pending_rebuild.pop(volume.id, None)
        if part.role == evidence.SOURCE and \
                self.source.read_by_committed_move(volume, part.move):
            self.source.export_again(volume, part.move)
        self.destination.report_contradiction(
            volume.id, t, part, 'its recovery (%s)'
            % plan(t, self.facts(volume, t)).name)
        return Action(KEEP_CONTRADICTED)

    def _act(self, action, volume, t):
        dest = self.destination
        if action.name == ABANDON:
            self._abandon(volume, t)
        elif action.name == LEAVE_TO_DEST:
            LOG.warning('Volume %(vol)s moves to %(dst)s (%(state)s) while '
                        'its record still names this node (the database '
                        'lost the write that names %(dst)s): the move is '
                        'committed, so it is left to %(dst)s, which names '
                        'itself in the record when it finalizes the move.',
                        {'vol': volume.id, 'dst': t.dest_node,
                         'state': t.state})
        elif action.name == REEXPORT:
            self.source.export_again(volume, t)
        elif action.name == DROP_ABORTED:
            dest.drop_aborted(volume, t)
        elif action.name == ROLL_BACK:
            dest.roll_back_unless_written(volume, t)
        elif action.name == ROLL_FORWARD:
            self._roll_forward(volume, t)
        elif action.name == TEAR_DOWN:
            if dest.named_here_while_preparing(volume, t):
                # (Named by another of this node's names: kept, and
                # reported if it cannot be rolled forward.)
                self._roll_forward(volume, t)
                return
            LOG.warning('Transfer of volume %s was half built; rolling '
                        'back this node.', volume.id)
            dest.tear_down(volume, t)
        elif action.name == FINALIZE:
            dest.pending_finalize.add(volume.id)
        elif action.name == AWAIT_OPERATOR:
            LOG.warning('The move of volume %(vol)s is being abandoned over '
                        'its lost source %(src)s; run "cinder-dmclone move '
                        'abandon-source %(vol)s" on this node again to '
                        'finish it.', {'vol': volume.id,
                                       'src': t.source_node})
        elif action.name == AWAIT_LVM:
            LOG.warning('Volume %(vol)s moves to this node (%(state)s), '
                        'but LVM cannot list its volume groups here: the '
                        'move is kept as it is (nothing rolled back, '
                        'finalized or rebuilt) and looked at again after '
                        'each monitor tick.',
                        {'vol': volume.id, 'state': t.state})
        elif action.name == REPORT_DELETED:
            LOG.warning('Volume %s has no LV here any more: its delete was '
                        'interrupted; delete it again.', volume.id)
        elif action.name == REBUILD:
            self._rebuild(volume, t, action)

    def _roll_forward(self, volume, t):
        """ROLL_FORWARD, then what recovery does in the state it gives.

        Without the volume's lock at start, as every action here (see
        :meth:`recover`): no request reaches this service yet, the
        source never writes the state of a move whose volume record
        names its destination, and the write is a compare-and-set on
        this very move.  The clone a reboot took is built again as the
        new state says (REBUILD, hydration off for ``cloned``); if its
        source does not answer, the monitor tries again
        (:meth:`retry_rebuilds`), for the move as recorded then.
        """
        rolled = self.destination.roll_forward(volume, t)
        if rolled is not None:
            self._act(plan(rolled, self.facts(volume, rolled)), volume,
                      rolled)

    def _abandon(self, volume, t):
        """ABANDON under the volume's lock, if the move still never committed.

        A start must not depend on the coordination backend being up: if
        the lock cannot be taken, the move is left to the monitor, which
        tries again after each tick (:meth:`retry_abandons`) until the
        abandon is done or the record no longer asks for it.
        """
        with move.lock_unless_down(volume.id) as locked:
            if not locked:
                self.pending_abandon[volume.id] = t
                LOG.warning('Not abandoning the move of volume %(vol)s to '
                            '%(dst)s yet: its lock cannot be taken. The '
                            'monitor tries again at each tick; until then '
                            'the volume is refused as moving.',
                            {'vol': volume.id, 'dst': t.dest_node})
                return
            self._abandon_locked(volume.id, t)

    def _abandon_locked(self, volume_id, t):
        """Abandon move ``t`` if it still never committed; lock held.

        The abort it sends makes the destination remove its clone: only
        for the move read again under the lock, in a state where no
        instance writes to that clone for good (ABANDONABLE), and while
        the volume record still names this node.  Anything else (the move
        ended, committed or replaced meanwhile, the volume deleted) ends
        the wait; a failure keeps it (:attr:`pending_abandon`).
        """
        try:
            current = self.source.load_any(volume_id)
            volume = objects.Volume.get_by_id(self.source.ctxt(), volume_id)
        except exception.VolumeNotFound:
            self.pending_abandon.pop(volume_id, None)
            return
        if not (t.still(current) and current.state in ABANDONABLE
                and self.source.lives_here(volume)):
            self.pending_abandon.pop(volume_id, None)
            LOG.warning('Not abandoning the move of volume %(vol)s: '
                        'it changed meanwhile (%(state)s).',
                        {'vol': volume_id,
                         'state': current.state if current else 'none'})
            return
        self.pending_abandon[volume_id] = t
        try:
            self.source.abandon(volume, current)
        except dmc_exception.MoveContradicted:
            pass        # (kept, logged: never given up against it)
        self.pending_abandon.pop(volume_id, None)

    def retry_abandons(self):
        """Abandon the moves a start could not (after each monitor tick).

        The start found a move from here that never committed but could
        not take its lock (the coordination backend was down) or failed
        meanwhile: tried again under the volume's lock, never waiting for
        it (a busy or unreachable lock waits for the next tick), the
        record read again under it.
        """
        for volume_id, t in sorted(self.pending_abandon.items()):
            with move.lock_if_free(volume_id) as locked:
                if not locked:
                    continue
                try:
                    self._abandon_locked(volume_id, t)
                except move.MoveStateInvalid:
                    self.pending_abandon.pop(volume_id, None)
                    LOG.exception('Not abandoning the move of volume %s.',
                                  volume_id)
                except Exception:
                    LOG.exception('Abandoning the move of volume %s failed; '
                                  'trying again at the next monitor tick.',
                                  volume_id)

    def _rebuild(self, volume, t, action):
        # (FINALIZING after a reboot: rebuild the clone so that the swap
        # can check it is fully hydrated.)
        self.destination.rebuild(volume, t, action.hydrate)
        # (action.commit: never without the source's word that no
        # instance there holds its copy; the monitor's next tick asks for
        # it, and reports a refusal.)
        if action.finalize:
            self.destination.pending_finalize.add(volume.id)
        LOG.info('Clone of volume %(vol)s rebuilt after restart '
                 '(%(state)s).', {'vol': volume.id, 'state': t.state})
