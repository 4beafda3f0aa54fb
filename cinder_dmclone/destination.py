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

"""The destination's side of a move: the node a volume moves to.

The source asks this node to build the clone (``prepare``), or to remove
what it built for a move it gave up (``abort``).  Afterwards the
destination owns the move: detaches decide a live migration (commit or
roll back), the monitor's finished clones are finalized here, and a
delete, an extend or a retype of a volume moving here act on its clone.
"""

import collections
import contextlib
import time

from oslo_log import log as logging
import oslo_messaging
from oslo_utils import excutils

from cinder import exception
from cinder.i18n import _
from cinder import objects
from cinder.volume import volume_utils

from cinder_dmclone import attachments
from cinder_dmclone import dmsetup
from cinder_dmclone import evidence
from cinder_dmclone import exception as dmc_exception
from cinder_dmclone import layout
from cinder_dmclone import map_mark
from cinder_dmclone import move
from cinder_dmclone import peer
from cinder_dmclone import side
from cinder_dmclone import source
from cinder_dmclone import thin

LOG = logging.getLogger(__name__)


def hydration_tuning(volume_type, threshold, batch_size):
    """Threshold and batch size: the volume type's extra specs, else these.

    Raises InvalidVolumeType for a value that is not a positive integer.
    """
    specs = (volume_type or {}).get('extra_specs') or {}
    values = []
    for name, default in (('hydration_threshold', threshold),
                          ('hydration_batch_size', batch_size)):
        raw = specs.get('dmclone:%s' % name)
        if raw is None:
            values.append(default)
            continue
        try:
            value = int(raw)
        except (TypeError, ValueError):
            value = 0
        if value < 1:
            raise exception.InvalidVolumeType(
                reason=_('extra spec dmclone:%(name)s=%(raw)r must be a '
                         'positive integer') % {'name': name, 'raw': raw})
        values.append(value)
    return tuple(values)


def _remove_mark(marks, volume_id, what_is_left):
    """Remove the mark of ``volume_id`` in ``marks`` (None: none kept).

    A failure is only logged, ``what_is_left`` saying why that is safe
    (with ``%(dir)s``, the marks' directory): a mark names one move.
    """
    if marks is None:
        return
    try:
        marks.remove(volume_id)
    except Exception:
        LOG.warning('Volume %(vol)s: ' + what_is_left,
                    {'vol': volume_id, 'dir': marks.directory},
                    exc_info=True)


class _Prepares(object):
    """The volumes whose prepare runs in this process, counted.

    A set would forget a volume when the first of two overlapping
    prepares of it (a stale one stuck in its login, a later one waiting
    for the build lock) ends.
    """

    def __init__(self):
        self._count = collections.Counter()

    def add(self, volume_id):
        self._count[volume_id] += 1

    def discard(self, volume_id):
        if self._count[volume_id] > 1:
            self._count[volume_id] -= 1
        else:
            self._count.pop(volume_id, None)

    def __contains__(self, volume_id):
        return self._count.get(volume_id, 0) > 0


class Destination(side.Side):
    """Moves of volumes into this node.

    Besides the shared tools (see :class:`~cinder_dmclone.side.Side`):
    ``clones``, this node's :class:`~cinder_dmclone.clone.Clones`, and
    ``tuning(volume_type)``, the hydration threshold and batch size of a
    volume type (see :func:`hydration_tuning`); ``marks``, this node's
    own marks of clones thin mapped here
    (:class:`~cinder_dmclone.map_mark.MapMarks`; None only in tests that
    never map a clone); ``end_marks``, this node's marks of a move's end
    begun here (:meth:`mark_end`; None: no set-back move is ever ended
    here, only kept); ``evidence``, this node's marks of the move it
    takes part in (see :class:`~cinder_dmclone.side.Side`).
    """

    #: Seconds the monitor leaves a source alone after a call to it timed
    #: out: each call waits for the RPC timeout, and the tick serves every
    #: clone of the node in turn.
    PEER_REST = 60

    def __init__(self, node_names, node_name, store, peer_client, clones,
                 tuning, clock=time.monotonic, service_host=None,
                 thin_map=False, marks=None, end_marks=None,
                 evidence=None):
        super().__init__(node_names, node_name, store, peer_client,
                         service_host=service_host, evidence=evidence)
        self.clones = clones
        self.tuning = tuning
        #: apply the region maps of thin sources (dmclone_thin_map).
        self.thin_map = thin_map
        self.marks = marks
        self.end_marks = end_marks
        self._clock = clock
        #: source node -> until when the monitor does not call it.
        self.resting = {}
        #: source node -> the volume whose step to it timed out last,
        #: and the others that waited for it during the rest.
        self.yielding = {}
        self.waited = collections.defaultdict(set)
        #: volumes whose finalization failed; retried after each tick.
        self.pending_finalize = set()
        #: volumes kept in ``cloned`` after writes here (see hold).
        self.held = set()
        #: volumes whose source detached but has not confirmed that its
        #: copy is closed (see commit_once_closed); asked at each tick.
        self.awaiting_source = set()
        #: volume id -> the secret of its move whose commit an attachment
        #: on the source was last reported to hold (once per move).
        self.held_reported = {}
        #: LV name -> volume id of the moves into this node: an LV is not
        #: always named after its volume (a migrated volume's _name_id).
        self.lv_volumes = {}
        #: volumes whose prepare runs here now (see drop_stale_prepare),
        #: counted: two prepares of one volume may overlap.
        self.building = _Prepares()
        #: volume id -> the secret of its move last aborted here: a
        #: prepare of that move that took the build lock after its
        #: abort builds nothing (see prepare).
        self.aborted_here = {}
        #: volume id -> the secret of its move last aborted here, until
        #: the record says how the source ended it: an abort that failed
        #: here (LVM unable to list the group, say), or whose answer the
        #: source never had (an RPC timeout), leaves the record
        #: ``aborted`` with nothing loaded here for the monitor to find
        #: it by (Recovery.retry_aborts).
        self.abort_owed = {}
        #: volume id -> the secret of its move whose clone this process
        #: marked thin mapped, or found marked here (see was_mapped): the
        #: guard holds in this process even if the record's mark is
        #: dropped meanwhile (Cinder's Volume.save rewrites admin
        #: metadata whole, from a stale copy).
        self.mapped = {}
        #: volume id -> (secret, when) this node first saw that move
        #: preparing, on its own clock (see prepare_age).
        self.prepare_seen = {}
        #: volume id -> the secret of its rewound move last reported as
        #: one that cannot be rolled forward (see roll_forward).
        self.rewound_reported = {}
        #: volume id -> the secret of its move last reported as not
        #: rolled back because its clone is open (_attach_here_withdrawn).
        self.open_reported = {}

    # -- steps the source asks for ----------------------------------------

    def prepare(self, volume, step):
        """Build the clone of a volume moving here; return its path.

        The source records the outcome (it holds the volume's lock while
        it waits for this answer): nothing here writes the state.
        """
        self.building.add(volume['id'])
        try:
            with move.build_lock(volume['id']):
                # Checked (again) once the lock is ours: while this step
                # waited, its move may have been given up and a later one
                # built.
                t = self.authenticate(volume, step)
                if t.state != move.PREPARING:
                    raise exception.VolumeBackendAPIException(
                        data=_('No transfer of volume %s to this node is '
                               'being prepared.') % volume['id'])
                self.refuse_if_aborted_here(volume, t)
                # (A move of its own: an earlier one's hold is over.)
                self.held.discard(volume['id'])
                # (The source called once it had recorded the move.)
                self.prepare_seen[volume['id']] = (t.secret, self._clock())
                self._mark_part(volume, t)
                self.refuse_if_lost_copy(volume, t)
                return self._build(volume, step, t)
        finally:
            self.building.discard(volume['id'])

    def refuse_if_aborted_here(self, volume, t):
        """Refuse the prepare of a move this node already aborted.

        A prepare and its abort are served at once (RPC workers): a
        prepare that stalled before the build lock until its source
        timed out and sent the abort may take the lock after it, while
        the record still says ``preparing`` (the source clears it only
        once the abort answered).  Built then, the clone would stay,
        named by no record.
        """
        if self.aborted_here.get(volume['id']) == t.secret:
            raise exception.VolumeBackendAPIException(
                data=_('The transfer of volume %s to this node was aborted '
                       'by its source.') % volume['id'])

    def _mark_part(self, volume, t):
        """Mark that this node is ``t``'s destination, before any build.

        (:mod:`~cinder_dmclone.evidence`.)  With the ACL its source
        recorded its export gives this node, for a record this node may
        have to write back (:meth:`restore_record`).  PartNotRecorded if
        the mark is not on disk: the prepare is refused, nothing built.
        """
        if self.evidence is None:
            return
        export = self.store.move_export(self.ctxt(), volume['id'])
        self.evidence.record(t, evidence.DESTINATION,
                             export and ' '.join(export))

    def end_part(self, volume_id, t):
        """This node's part in move ``t`` is over: its mark goes.

        Before the record of ``t`` is cleared, so that a crash in between
        leaves a record without a mark (no evidence: as before marks
        existed), never a mark of a move that is over with its copy
        still here.
        """
        if self.evidence is not None:
            self.evidence.forget(volume_id, t)

    def old_copy(self, t):
        """True if move ``t``'s data LV is here without a metadata LV.

        No move leaves such an LV behind: a build creates the metadata
        LV before the data LV, a teardown removes (or renames, to wipe
        it) the data LV before the metadata LV, and only a finalization
        removes the metadata LV of a data LV it keeps, which no move in
        ``preparing`` or ``aborted`` reaches.  So it is an old copy of
        the volume, never a leftover of an earlier attempt: most likely
        the one a move away from this node left when it was abandoned as
        lost (:mod:`cinder_dmclone.lost_source`), whatever the loss
        record says now (a later abandon elsewhere replaces it).  It may
        hold the only copy of some regions: nothing but an operator may
        remove it.  Read from LVM's own listing alone (Clones.listed):
        brick's lookup takes a volume group not found (a PV scanned late
        after a reboot) for no LV, and a decision to wipe would rest on
        that; a group LVM cannot list raises LVMUnlisted.
        """
        data, meta = self.clones.listed(t)
        return data and not meta

    def kept_copy(self, volume, t):
        """True if move ``t``'s data LV here is an old copy kept by a rollback.

        A rollback of a clone that lost its metadata LV keeps the data LV
        and records it under this node's old-copy key first
        (:meth:`roll_back_without_metadata`): a later abort of the same
        move (its source finishing the cut rollback, or its restart)
        must not wipe it.  Read from the database only for a data LV
        with no metadata LV beside it (:meth:`old_copy`); a failed read
        fails the teardown, which keeps everything.
        """
        if not self.old_copy(t):
            return False
        copies = self.store.old_copies(self.ctxt(), volume['id'])
        return any(copies.get(name) == t.lv_name for name in self.node_names)

    def _recorded_lost_copy(self, loss):
        """The old LV the loss record says is here, if it still is.

        (Named after the volume when it was abandoned: a later
        ``_name_id`` names the volume's LV differently.)
        """
        lv = loss.get('lost_source_lv')
        if loss.get('lost_source') not in self.node_names or not lv:
            return None
        # (LVM's own listing, as old_copy; LVMUnlisted if it cannot.)
        data, meta = self.clones.listed_lv(lv)
        return lv if data and not meta else None

    def refuse_if_lost_copy(self, volume, t):
        """Refuse a move here while this node holds an old copy.

        Checked before the build removes anything: the build's first
        step tears down what an earlier attempt left, which would wipe
        the old copy (see :meth:`old_copy`).  LostCopyHere names it and
        says what to do; StrayCopyHere when the loss record no longer
        names this node.  Which LVs are here is LVM's own listing: while
        it cannot list a group here, whether an old copy is here cannot
        be told, and the move is refused (StepUnlisted), nothing touched.
        """
        loss = self.store.loss(self.ctxt(), volume['id'])
        with self.refused_while_unlisted(
                volume, _('its move here from %s') % t.source_node):
            lv = self._recorded_lost_copy(loss)
            stray = lv is None and self.old_copy(t)
        if stray:
            lv = t.lv_name
            exc = dmc_exception.StrayCopyHere(
                volume=volume['id'], node=self.node_name, lv=lv,
                meta=layout.metadata_lv_name(lv))
        elif lv is not None:
            exc = dmc_exception.LostCopyHere(
                volume=volume['id'], node=self.node_name, lv=lv,
                at=loss.get('lost_at'), file=loss.get('lost_ranges_file'))
        else:
            return
        LOG.error('Refusing to take volume %(vol)s from %(src)s: this node '
                  'still holds LV %(lv)s, an old copy of the volume with no '
                  'dm-clone metadata LV beside it (left by a move abandoned '
                  'as lost?); copy what is needed from it and remove it by '
                  'hand first.',
                  {'vol': volume['id'], 'src': t.source_node, 'lv': lv})
        raise exc

    @contextlib.contextmanager
    def refused_while_unlisted(self, volume, step):
        """Refuse ``step`` on ``volume`` if LVM cannot list a group here.

        The block reads which LVs are here from LVM's own listing and
        raises LVMUnlisted before it changes anything: that becomes
        StepUnlisted, which says what was refused and what to do (an
        error the caller may retry once LVM lists the group).
        """
        try:
            yield
        except dmc_exception.LVMUnlisted as exc:
            refused = dmc_exception.StepUnlisted.of(
                exc, volume['id'], self.node_name, step)
            LOG.error('%s', refused.msg)
            raise refused from exc

    def metadata_here(self, volume):
        """True if LVM lists a metadata LV of ``volume``'s LV here.

        (A clone's: its data LV may hold only the regions copied so far.)
        LVM's own listing of the metadata group: while LVM cannot list
        it, whether the LV is partly copied cannot be told, and mapping
        it alone is refused (StepUnlisted, naming the group).
        """
        with self.refused_while_unlisted(
                volume, _('mapping its LV %s alone') % volume['name']):
            return self.clones.metadata_listed(volume['name'])

    def tear_down(self, volume, t, keep_data=False, deleted_here=False):
        """Remove what move ``t`` built here; never an old copy.

        A move that was refused because this node holds an old copy of
        the volume (:meth:`refuse_if_lost_copy`) is given up by its
        source, which asks this node to abort it: its data LV, named
        like that copy, was never built here and stays.  Which it is,
        LVM alone tells (:meth:`old_copy`): no database read, so a
        half-built clone goes also while the database is away.  A move
        past ``preparing`` was built (the check passed), so its data LV
        is its own.  This node's thin-mapped mark of the volume goes
        with the clone (:meth:`drop_node_mark`).

        ``deleted_here``: the volume is being deleted and its record
        names this node (a move set back to ``preparing`` after its
        commit, see :meth:`delete`): its data LV here is the volume,
        even without a metadata LV beside it (the move had finished, or
        the clone lost it), and goes, wiped, unless the record names it
        an old copy kept here (:meth:`kept_copy`).

        Never for a record that this node's own mark contradicts
        (MoveContradicted, nothing done): what is here is another move's.
        """
        self.refuse_if_contradicted(
            volume['id'], t, 'removing what the move built here')
        self._remove_built(volume, t, keep_data, deleted_here)

    def _remove_built(self, volume, t, keep_data=False, deleted_here=False):
        """:meth:`tear_down`'s removal, whatever this node's mark says.

        Only :meth:`tear_down` and a delete of the volume (which keeps
        nothing for any move) call it.
        """
        keep = keep_data or (t.state in (move.PREPARING, move.ABORTED)
                             and not deleted_here and self.old_copy(t)) \
            or self.kept_copy(volume, t)
        if keep and not keep_data:
            LOG.warning('Keeping LV %(lv)s while removing what the move of '
                        'volume %(vol)s built here: it has no metadata LV, '
                        'so no move built it; it is an old copy of the '
                        'volume, for an operator to remove.',
                        {'lv': t.lv_name, 'vol': volume['id']})
        self.clones.tear_down(t, volume['provider_auth'], keep_data=keep)
        self.drop_node_mark(volume['id'])

    def _build(self, volume, step, t):
        self.lv_volumes[t.lv_name] = volume['id']
        clones = self.clones
        hydrate = bool(step.get('hydrate'))
        threshold, batch = self.tuning(volume.volume_type)
        size_gb = int(step.get('size_gb') or volume['size'])
        try:
            # Anything here is left from an earlier attempt that was given
            # up (the source timed out and cleared its state): never reuse
            # a clone or metadata LV whose regions may hold stale data.
            self.tear_down(volume, t)
            # Decided before the space check, which counts what the map
            # leaves to copy: from here on the move applies it or is
            # given up (the teardown below), never copies every region.
            needed = self._region_map(volume, step, t, hydrate)
            mapped = needed is not None
            # (One move at a time: the next check counts this one's LVs.)
            with move.space_lock(clones.vg.vg_name):
                clones.check_space(t, size_gb, self.node_name, needed)
                clones.create_volumes(t, size_gb)
            path = clones.connect_source(t, volume['provider_auth'])
            path = clones.build_clone(t, path, hydrate and not mapped,
                                      threshold, batch,
                                      discard_passdown=not mapped)
            if mapped:
                self._apply_map(volume, t, needed, hydrate)
        except Exception:
            with excutils.save_and_reraise_exception():
                LOG.exception('Building the clone of volume %s failed; '
                              'removing what was built.', volume['id'])
                self.tear_down(volume, t)
                self.end_part(volume['id'], t)
        self._refuse_if_given_up(volume, t)
        LOG.info('Clone of volume %(vol)s built over %(src)s (hydration '
                 '%(h)s).', {'vol': volume['id'], 'src': t.source_node,
                             'h': 'on' if hydrate else 'off'})
        return path

    def _region_map(self, volume, step, t, hydrate):
        """The regions the source's thin LV holds, if this move may use them.

        The prepare of a move whose source LV nobody writes carries them
        (:data:`peer.REGION_MAP <cinder_dmclone.peer.REGION_MAP>`, see
        doc/source/contributor/thin-map.rst).  Used only when this node
        applies maps (``dmclone_thin_map``), the move hydrates at once
        (a live migration's source still writes), the LV built here
        reads zeroes where nothing is copied (:meth:`Clones.reads_zeroes
        <cinder_dmclone.clone.Clones.reads_zeroes>`: a thick one is
        never zeroed here, it copies every region), and the map is made
        for this clone's very geometry.  None otherwise: every region is
        copied, which is always correct.
        """
        token = step.get(peer.REGION_MAP)
        if not token:
            return None
        reason = None
        if not self.thin_map:
            reason = 'dmclone_thin_map is off on this node'
        elif not hydrate:
            reason = 'its source is still in use'
        else:
            try:
                if not self.clones.reads_zeroes(recorded_if_inactive=True):
                    reason = ('its LV here would not read zeroes where '
                              'nothing is copied (a thick LV, or a thin '
                              'pool with skip_block_zeroing)')
            except Exception as exc:
                reason = ('whether its thin pool here zeroes new blocks '
                          'cannot be read (%s)' % exc)
        if reason is None:
            try:
                return thin.decode_regions(
                    token, dmsetup.region_count(t.clone_sectors,
                                                t.region_sectors),
                    t.region_sectors)
            except dmc_exception.RegionMapInvalid as exc:
                reason = str(exc)
        LOG.info('Volume %(vol)s: every region is copied from %(src)s, '
                 'without the map of its thin LV: %(why)s.',
                 {'vol': volume['id'], 'src': t.source_node, 'why': reason})
        return None

    def _apply_map(self, volume, t, needed, hydrate):
        """Discard the regions the source never mapped, then hydrate.

        Before the clone's path is returned to anyone, with hydration
        off: no copy and no write is in flight while the discards run.
        The pool must still zero new blocks when hydration starts (it
        was read before the build): if not, the move is given up.  The
        move's record says so before the first discard
        (:meth:`_record_map`), and stops saying so if nothing was
        discarded after all (:meth:`_forget_map`).
        """
        # The pool's zeroing was read before the build, from LVM's record
        # if the pool had no thin LV yet: its table, now that the LVs
        # exist, is read before the first discard as after the last.
        self._refuse_unless_zeroing(volume, 0)
        self._record_map(volume, t)
        skipped = self.clones.apply_map(t, needed)
        if not skipped:
            self._forget_map(volume, t)
        else:
            self._refuse_unless_zeroing(volume, skipped)
        total = dmsetup.region_count(t.clone_sectors, t.region_sectors)
        if skipped is None:
            LOG.info('Volume %(vol)s: every region is copied from %(src)s '
                     '(its clone was open, its map not applied).',
                     {'vol': volume['id'], 'src': t.source_node})
        else:
            LOG.info('Volume %(vol)s: %(skip)d of its %(total)d regions '
                     'hold no data on %(src)s and are not copied.',
                     {'vol': volume['id'], 'skip': skipped, 'total': total,
                      'src': t.source_node})
        if hydrate:
            self.clones.enable_hydration(t)

    def _refuse_unless_zeroing(self, volume, skipped):
        """Give the move up (InvalidTable) unless the pool zeroes new blocks.

        ``skipped``: the regions of the clone already marked copied
        without a copy (0 before the discards).  A region copied into
        a chunk of a pool that does not zero would leave the pool's old
        data, another volume's, in those regions.
        """
        why = self._pool_not_zeroing()
        if why is None:
            return
        LOG.error('Volume %(vol)s: thin pool %(vg)s/%(pool)s does not zero '
                  'new blocks (%(why)s) with %(n)d regions of its clone '
                  'marked copied without a copy: a region copied into a '
                  'chunk of the pool would leave the pool\'s old data in '
                  'regions never copied. The move is given up. Keep the '
                  'pool\'s zeroing on (lvchange --zero y) while moves with '
                  'dmclone_thin_map run.',
                  {'vol': volume['id'], 'vg': self.clones.vg.vg_name,
                   'pool': self.clones.thin_pool, 'why': why, 'n': skipped})
        raise dmc_exception.InvalidTable(
            reason='thin pool %s/%s does not zero new blocks while the map '
                   'of volume %s is applied'
            % (self.clones.vg.vg_name, self.clones.thin_pool, volume['id']))

    def _record_map(self, volume, t):
        """Mark move ``t`` thin mapped (record and node) before any discard.

        The guard on the clone's hydration (:meth:`guard_pool_zeroing`)
        must outlive this process: every later start reads it
        (:meth:`rebuild`, the monitor: :meth:`was_mapped`), and a crash
        right after a discard must not lose it, so it is durable first.
        Twice: the record's mark is seen from every node, but a stale
        whole write of the volume's admin metadata (Cinder's
        ``Volume.save``) can drop it; this node's own file
        (:mod:`~cinder_dmclone.map_mark`) nothing else writes.  The
        record first: its write checks that the move is still this one.
        A mark whose discards never ran is harmless (it only stops
        hydration while the pool does not zero).  A failure of either
        gives the move up, before anything is discarded
        (ThinMapNotRecorded): its space was counted with the map, so it
        cannot copy every region instead.
        """
        try:
            self.store.mark_thin_mapped(self.ctxt(), t)
            if self.marks is not None:
                self.marks.write(volume['id'], move.thin_map_tag(t.secret))
        except Exception as exc:
            raise dmc_exception.ThinMapNotRecorded(
                volume=volume['id'], reason=exc) from exc
        self.mapped[volume['id']] = t.secret

    def _forget_map(self, volume, t):
        """Nothing was discarded: the clone needs no guard after all.

        (Its clone was open, or every region holds data.)  A failure is
        only logged: the mark left costs a stop of hydration while the
        pool does not zero, never data.
        """
        if self.mapped.get(volume['id']) == t.secret:
            del self.mapped[volume['id']]
        self.drop_node_mark(volume['id'])
        try:
            self.store.forget_thin_map(self.ctxt(), t)
        except Exception:
            LOG.warning('Volume %s: its move is still marked thin mapped '
                        'although nothing was discarded; its hydration '
                        'stops whenever the thin pool here does not zero '
                        'new blocks.', volume['id'], exc_info=True)

    def drop_node_mark(self, volume_id):
        """Remove this node's mark of ``volume_id``'s clone, if any.

        Once that clone is gone (torn down, swapped to linear) or was
        never mapped: no clone of the volume here needs it.  A failure
        is only logged: a mark left names its move alone (a later move
        of the volume finds it inert, and its build replaces or removes
        it), and at worst pauses that move's hydration while the pool
        does not zero.
        """
        _remove_mark(self.marks, volume_id,
                     'its thin-mapped mark here (%(dir)s) could not be '
                     'removed; it is inert for any later move of the '
                     'volume.')

    # -- end marks ---------------------------------------------------------

    def mark_end(self, t, how):
        """Mark, durably, that move ``t`` is about to end here ``how``.

        Written just before the step that no set-back record can tell
        afterwards: a finalization's swap to linear of its fully hydrated
        clone (``move.END_SWAP``, see :meth:`_swapped`) or a rollback's
        teardown (``move.END_ROLLBACK``, see :meth:`_emptied`).  Node
        local (:mod:`~cinder_dmclone.map_mark`): no stale save of the
        record and no volume owner can write or remove it.  Raises if
        the mark is not on disk.
        """
        if self.end_marks is None:
            raise OSError('no directory of end marks on this node')
        self.end_marks.write(t.volume_id, move.end_tag(t.secret, how))

    def ended_here(self, t, how):
        """True if this node's end mark says move ``t`` was ending ``how``.

        False for no mark, another move's or another end's, a move
        without a secret, or a mark that cannot be read: no mark is no
        evidence.
        """
        if self.end_marks is None or not t.secret:
            return False
        try:
            value = self.end_marks.read(t.volume_id)
        except Exception:
            LOG.warning('Volume %(vol)s: its end mark here (%(dir)s) '
                        'cannot be read.', {'vol': t.volume_id,
                                            'dir': self.end_marks.directory},
                        exc_info=True)
            return False
        return map_mark.same_tag(value, move.end_tag(t.secret, how))

    def drop_end_mark(self, volume_id):
        """Remove this node's end mark of ``volume_id``, if any.

        Once its move is cleared, or goes on otherwise (a commit, a
        hold).  A failure is only logged: a mark names its move alone,
        and no set-back record of a cleared move passes the other
        checks that go with it (:meth:`_emptied`, :meth:`_swapped`).
        """
        _remove_mark(self.end_marks, volume_id,
                     'its end mark here (%(dir)s) could not be removed; it '
                     'names a move that is over.')

    def _pool_not_zeroing(self):
        """None if this node's thin pool zeroes new blocks; else why not."""
        try:
            if self.clones.reads_zeroes():
                return None
            return 'its thin-pool table carries skip_block_zeroing'
        except Exception as exc:
            return 'its thin-pool table cannot be read: %s' % exc

    def was_mapped(self, t):
        """True if move ``t``'s clone was thin mapped (or about to be).

        As the move's record says (:meth:`_record_map`), or this node's
        own mark (:meth:`_marked_here`): also after a restart or a
        reboot of this node, should a stale write have dropped the
        record's; or as this process remembers (:attr:`mapped`).
        Never the clone's ``no_discard_passdown``: dm-clone reports that
        as well over any destination that cannot discard.
        """
        if not t.secret:
            return t.thin_mapped
        if t.thin_mapped:
            if self.mapped.get(t.volume_id) != t.secret:
                # (A mark of the previous release's single key, which
                # wrote no node mark: a stale save must not drop the
                # guard with it, nor a restart after that.)
                self.mapped[t.volume_id] = t.secret
                self._mark_here(t)
            return True
        if self.mapped.get(t.volume_id) != t.secret and self._marked_here(t):
            self.mapped[t.volume_id] = t.secret
        return self.mapped.get(t.volume_id) == t.secret

    def _mark_here(self, t):
        """Write this node's mark of mapped move ``t`` unless it is there.

        For a clone whose record alone says it was mapped (a move mapped
        by the previous release, which wrote no node mark).  Not while a
        prepare of the volume runs in this process (:attr:`building`),
        whose mark is newer than the record read here.  A failure is
        only logged: the guard holds in this process, and the record's
        mark stays until a stale save drops it.
        """
        if self.marks is None or t.volume_id in self.building:
            return
        tag = move.thin_map_tag(t.secret)
        try:
            if map_mark.same_tag(self.marks.read(t.volume_id), tag):
                return
            self.marks.write(t.volume_id, tag)
        except map_mark.MarkNameInvalid:
            return
        except Exception:
            LOG.warning('Volume %(vol)s: its clone is thin mapped, but its '
                        'mark here (%(dir)s) could not be written: a stale '
                        'save of its admin metadata and a restart would '
                        'lose its guard.',
                        {'vol': t.volume_id, 'dir': self.marks.directory},
                        exc_info=True)
            return
        LOG.info('Volume %s: its clone is marked thin mapped here too (its '
                 'record alone said so).', t.volume_id)

    def _marked_here(self, t):
        """True if this node's mark names move ``t`` (or cannot be read).

        A mark of another move is inert.  One that cannot be read might
        be this move's: the clone is taken as mapped (logged), which at
        worst pauses its hydration while the pool does not zero.
        """
        if self.marks is None:
            return False
        try:
            value = self.marks.read(t.volume_id)
        except map_mark.MarkNameInvalid:
            return False    # (no mark was ever written under it)
        except Exception:
            LOG.warning('Volume %(vol)s: this node\'s thin-mapped mark '
                        '(%(dir)s) cannot be read; its clone is guarded as '
                        'if mapped: its hydration stops while the thin pool '
                        'here does not zero new blocks.',
                        {'vol': t.volume_id, 'dir': self.marks.directory},
                        exc_info=True)
            return True
        return map_mark.same_tag(value, move.thin_map_tag(t.secret))

    def guard_pool_zeroing(self, volume_id, t, status):
        """Hydrate a clone built with a map only while its pool zeroes.

        For the monitor, each tick, and for a start (:meth:`rebuild`),
        while such a clone hydrates (one whose regions were marked
        copied here: :meth:`was_mapped`).
        Its discarded regions read the thin LV, where
        nothing is mapped, as copied: once the pool stops zeroing new
        blocks (``lvchange --zero n``, a reload of the pool), a region
        copied into a chunk that one of them shares would leave the
        pool's old data there.  Hydration is then stopped (the move
        stays: the instance may have written here), and started again
        once the pool zeroes.  A region the instance writes in part
        still starts its own copy meanwhile: the operator must turn
        zeroing back on.
        """
        why = self._pool_not_zeroing()
        if why is not None:
            if status.hydration_enabled:
                self.clones.disable_hydration(t)
                LOG.error('Volume %(vol)s: stopped hydrating its clone from '
                          '%(src)s: thin pool %(vg)s/%(pool)s no longer '
                          'zeroes new blocks (%(why)s), and regions of this '
                          'clone were marked copied without a copy (its '
                          'thin map): a copy into a chunk they share would '
                          'leave the pool\'s old data in them. Turn the '
                          'pool\'s zeroing back on (lvchange --zero y '
                          '%(vg)s/%(pool)s); hydration starts again at the '
                          'next check.',
                          {'vol': volume_id, 'src': t.source_node,
                           'vg': self.clones.vg.vg_name,
                           'pool': self.clones.thin_pool, 'why': why})
            return False
        if not status.hydration_enabled:
            self.clones.enable_hydration(t)
            LOG.warning('Volume %(vol)s: thin pool %(vg)s/%(pool)s zeroes '
                        'new blocks again; hydration from %(src)s goes on.',
                        {'vol': volume_id, 'src': t.source_node,
                         'vg': self.clones.vg.vg_name,
                         'pool': self.clones.thin_pool})
        return True

    def _refuse_if_given_up(self, volume, t):
        """Before answering: is the source still waiting for this move?

        A build that outlasted the source's transfer timeout (a network
        cut during the login) finishes after the source gave up and
        recorded the move ``aborted``, or cleared it (or a later move
        replaced it): nobody will attach to this clone, so it goes now.
        The source records the move only if this answer reaches it in
        time, so a give-up that lands after this check is still safe:
        the source's abort (or, if it cannot reach this node, the monitor
        seeing ``aborted``) removes the clone.
        """
        current = self.load_any(volume['id'])
        if t.same_move(current) and current.state == move.PREPARING:
            return
        LOG.warning('The source of volume %(vol)s gave up the move while '
                    'this node built its clone (state now %(state)s); '
                    'removing the clone.',
                    {'vol': volume['id'],
                     'state': current.state if current else 'none'})
        if current is not None and current.state == move.ABORTED \
                and self.is_dest(current):
            self.drop_aborted(volume, current)
        else:
            self.tear_down(volume, t)
            self.end_part(volume['id'], t)
        raise exception.VolumeBackendAPIException(
            data=_('The move of volume %s was given up by its source '
                   'while the clone was built here; nothing was kept.')
            % volume['id'])

    def abort(self, volume, step):
        """Remove what this node built for a move the source gave up.

        Only if the record still describes that move once the build lock
        is ours: the abort may have waited for a build, and meanwhile the
        move been given up for good and a later move of the volume built
        here.  (A move is aborted only by the source that gave it up, so
        its secret alone tells it apart.)  Refused for a committed move
        (hydrating, finalizing): its clone holds an instance's writes,
        and the source may still believe it never moved (a record still
        naming it after a lost database write).  An abort of the move
        this node's mark names, whose record a stale save replaced, is
        :meth:`_abort_marked`'s.
        """
        with move.build_lock(volume['id']):
            t = self.load_any(volume['id'])
            if t is not None and t.authentic(step.get('secret')):
                if t.state in (move.PREPARING, move.ABORTED):
                    self.aborted_here[volume['id']] = t.secret
                if t.state not in (move.PREPARING, move.CLONED,
                                   move.ABORTED):
                    LOG.error('Refusing to abort the move of volume %(vol)s '
                              'from %(src)s: it is committed (%(state)s) '
                              'and its clone here is the volume.',
                              {'vol': volume['id'], 'src': t.source_node,
                               'state': t.state})
                    raise exception.VolumeBackendAPIException(
                        data=_('The move of volume %(vol)s is committed '
                               '(%(state)s): it is not aborted.')
                        % {'vol': volume['id'], 'state': t.state})
                self.abort_owed[volume['id']] = t.secret
                self.tear_down(volume, t)
                self.end_part(volume['id'], t)
            elif not self._abort_marked(volume, step):
                LOG.warning('Abort of an earlier move of volume %s ignored: '
                            'the record describes another move now.',
                            volume['id'])

    def _abort_marked(self, volume, step):
        """Abort the move this node's mark names; False if it names another.

        The caller holds the build lock.  The record names another move
        (or none): a stale whole save replaced the record of the move
        into this node, and its source, unable to commit it, gave it up
        (Side.authenticate took the abort by this node's mark).  What was
        built here for it was never handed to an instance and took no
        writes: it goes, wiped, with its mark.  Refused (AbortRefused)
        once the volume record names this node, the move's destination:
        the move was committed, and its clone here is the volume.
        """
        t = self.marked_move(volume['id'], evidence.DESTINATION,
                             step.get('secret'))
        if t is None:
            return False
        volume = objects.Volume.get_by_id(self.ctxt(), volume['id'])
        if self.names_destination(volume, t):
            LOG.error('Refusing to abort the move of volume %(vol)s from '
                      '%(src)s that this node\'s mark names: the volume '
                      'record names this node, so it was committed and '
                      'its clone here is the volume.',
                      {'vol': volume['id'], 'src': t.source_node})
            raise dmc_exception.AbortRefused(volume=volume['id'],
                                             src=t.source_node)
        LOG.warning('Volume %(vol)s: its source %(src)s gave up the move '
                    'into this node that a stale copy of the admin '
                    'metadata replaced in its record (%(record)s); '
                    'removing what was built here for it.',
                    {'vol': volume['id'], 'src': t.source_node,
                     'record': side.describe_record(
                         self.load_any(volume['id']))})
        self.tear_down(volume, t)
        self.end_part(volume['id'], t)
        return True

    def prepare_age(self, t):
        """Side.prepare_age, on this node's clock: since it saw ``t`` first.

        Since its prepare reached this node, or since the monitor first
        found it (after a restart, which forgets): never earlier than
        the source recorded the move, so never older than the source's
        attempt.  The two nodes' wall clocks are never compared, nor is
        this node's transfer timeout used (Side.prepare_budget).  None
        for a move recorded by an older release (no start time).
        """
        if t.prepared_at is None:
            return None
        seen = self.prepare_seen.get(t.volume_id)
        if seen is None or seen[0] != t.secret:
            seen = (t.secret, self._clock())
            self.prepare_seen[t.volume_id] = seen
        return self._clock() - seen[1]

    def drop_stale_prepare(self, volume_id, t):
        """Remove a clone built here for a prepare nobody waits for.

        A clone whose move is still ``preparing`` longer than any attempt
        lasts (:meth:`~cinder_dmclone.side.Side.prepare_outlived`: the
        source waits at most the transfer timeout for this node's answer,
        then records the outcome), whose lock is free and whose prepare
        no longer runs here, was left by an attempt whose source could
        not record the outcome (the database went away as this node
        answered, or the answer never reached it) and could not reach
        this node to drop it: no instance uses it, and it reads the
        source for good.  The lock alone proves nothing: with per-node
        locks, or a lost lease of the coordination backend, it is free
        while the source records the commit.
        Under the lock (never waiting for it), and only if the record
        still describes that move, the move is marked ``aborted`` (the
        volume is usable on its source again) and what was built here
        goes.  The record stays ``aborted``, inert: the source ends it
        (its next move, delete or restart drops the export it made for
        the move, which this node cannot).  Returns True if it did.

        Never a move whose volume record names this node: that one was
        committed, and its record set back since; it is rolled forward
        at once, whatever its age (:meth:`roll_forward`), or kept.
        """
        if volume_id in self.building:
            return False
        with move.lock_if_free(volume_id) as locked:
            if not locked:
                return False    # the source may be waiting: not stale
            with move.build_lock(volume_id):
                current = self.load_any(volume_id)
                if not (self.is_dest(current) and t.still(current)
                        and current.state == move.PREPARING):
                    self.prepare_seen.pop(volume_id, None)
                    return False
                volume = objects.Volume.get_by_id(self.ctxt(), volume_id)
                if self.named_here_while_preparing(volume, current):
                    if self._roll_forward(volume, current) is None:
                        self._stop_kept_copy(current)
                    return False
                if not self.prepare_outlived(current) or \
                        self.contradiction(volume_id, current) is not None:
                    return False
                self.prepare_seen.pop(volume_id, None)
                LOG.warning('The move of volume %(vol)s from %(src)s is '
                            'still preparing, but its source no longer '
                            'waits for this node: aborting it.',
                            {'vol': volume_id, 'src': t.source_node})
                self.store.transition(self.ctxt(), current,
                                      (move.PREPARING,), move.ABORTED)
                self.tear_down(volume, current)
                self.end_part(volume_id, current)
                return True

    def named_here_while_preparing(self, volume, t):
        """True if the volume record names this node while ``t`` prepares.

        The source points the record here only after it committed the
        move (Source.move: the transition, then move_volume): a move
        still ``preparing`` whose volume lives here is a record set back
        by a write of an older copy (R14-4: Cinder's Volume.save writes
        admin metadata whole, with delete=True, from a copy read before
        the commit).  Its clone here is the volume, with every write
        since the commit: it is never torn down as a stale prepare.
        Any name of this node's counts here (its service's host too),
        and the move's destination host whatever it is: a roll-forward
        needs the latter (:meth:`roll_forward`).
        """
        host = volume['host']
        if not host:
            return False
        return (volume_utils.extract_host(host, 'host') in self.record_names
                or self.names_destination(volume, t))

    def roll_forward(self, volume, t):
        """Roll move ``t`` forward if its record was set back to preparing.

        For a start (Recovery), which runs before this service serves
        requests, or a caller that holds the volume's lock; the build
        lock is taken here.  Returns the move as rolled forward, or None
        if nothing was done (the record changed meanwhile, or the move
        cannot be rolled forward: :meth:`_roll_forward`).
        """
        with move.build_lock(volume['id']):
            current = self.load_any(volume['id'])
            if not (self.is_dest(current) and t.still(current)
                    and current.state == move.PREPARING):
                return None
            volume = objects.Volume.get_by_id(self.ctxt(), volume['id'])
            if not self.named_here_while_preparing(volume, current):
                return None
            return self._roll_forward(volume, current)

    def _roll_forward(self, volume, t):
        """Give move ``t``, committed then set back, its state again.

        The caller holds the build lock, and read ``t`` (``preparing``)
        and ``volume``, which names this node, under it
        (:meth:`named_here_while_preparing`).  Only a move whose volume
        record names its destination (Side.names_destination: the source
        wrote it after its commit, and no volume owner can write it) and
        that no prepare in this process builds now.  Which state it had
        is read from what the stale save cannot set back, this node's
        clone (:meth:`rewound_state`), and written by a compare-and-set
        on this very move (Store.roll_forward): a second caller finds it
        rolled forward already and does nothing.  What the save dropped
        comes back by itself: the monitor publishes the progress at its
        next tick, a ``cloned`` move marks what it waits for again
        (:meth:`commit_pending`), and this node's own mark keeps a thin
        map's guard (:meth:`was_mapped`).  Returns ``t`` rolled forward,
        or None; one that cannot be is kept as it is, logged once.  A
        rollback cut short after its teardown here (:meth:`_emptied`) is
        finished (:meth:`_roll_back_emptied`), and None returned; a
        finalization cut short after its swap (:meth:`_swapped`) is
        rolled forward to ``finalizing``.
        """
        if t.volume_id in self.building:
            return None
        if not self.names_destination(volume, t):
            state, why = None, ('its record names %s, not the move\'s '
                                'destination %s' % (volume['host'],
                                                    t.dest_host))
        elif self._emptied(volume, t):
            self._roll_back_emptied(volume, t)
            return None
        elif self._swapped(volume, t):
            state, why = move.FINALIZING, None
        else:
            state, why = self.rewound_state(t)
        if state is None:
            self._report_rewound(volume, t, why)
            return None
        try:
            self.store.roll_forward(self.ctxt(), t, state)
        except move.MoveStateConflict:
            return None     # (changed since the read: nothing to do)
        self.prepare_seen.pop(t.volume_id, None)
        self.rewound_reported.pop(t.volume_id, None)
        if state == move.HYDRATING:
            self.held.discard(t.volume_id)
            self.awaiting_source.discard(t.volume_id)
        LOG.warning('Volume %(vol)s lives on this node by its record, but '
                    'its move from %(src)s was recorded as preparing again '
                    '(a stale copy of its admin metadata saved whole): '
                    'rolled forward to %(state)s.',
                    {'vol': t.volume_id, 'src': t.source_node,
                     'state': state})
        return t

    def _emptied(self, volume, t):
        """True if set-back move ``t`` is a rollback finished here (R16-1).

        The rollback's teardown ran here (:meth:`rollback`: the
        teardown, then the record pointed back at the source), then the
        service died, and a stale save set the record back: this node
        holds no copy, and the source's is the volume.  Each of these
        must hold, or the move is kept for an operator:

        * this node's end mark names this move's rollback
          (:meth:`mark_end`, written just before its teardown; no stale
          save reaches it): not a committed move whose LV an operator
          or a new disk took, nor a move finished long ago;
        * nothing of the move here by LVM's own listing of its volume
          groups, and no handle loaded (Clones.holds_nothing): not a
          transient miss (brick reads 'Volume group not found' as "no
          such LV"), nor a teardown cut short before its metadata LV
          went;
        * the record's LV is the volume's LV now (``volume.name``: a
          copy saved after a migration gave the volume another
          ``_name_id`` names an LV this node never held);
        * the volume is not being deleted: that is left to its delete,
          which retires the source's copy too (:meth:`delete`).

        Cinder's columns read here (host, status, ``_name_id``) are not
        written by a save of admin metadata.
        """
        return (volume['status'] not in ('deleting', 'error_deleting')
                and t.lv_name == volume['name']
                and self.ended_here(t, move.END_ROLLBACK)
                and self.clones.holds_nothing(t))

    def _swapped(self, volume, t):
        """True if set-back move ``t`` was being finalized here (R16-3).

        Its finalization swapped the clone to linear and removed its
        metadata LV, then could not retire the source before the stale
        save set the record back: the copy here is whole, and only the
        source's old copy and its export remain to go.  What tells it,
        none of which a volume owner or the stale save can write:

        * this node's end mark names this move's swap (:meth:`mark_end`):
          a finalization writes it once the clone is fully hydrated, just
          before the swap (Clones.swap_to_linear refuses one before).
          Nothing else writes it: not an operator's abandon of a lost
          source, which maps the LV linearly too, over regions it
          zeroed (:mod:`~cinder_dmclone.lost_source`; it refuses a
          fully hydrated clone);
        * the data LV here, and its handle loaded with no clone segment
          left (Clones.swapped): the swap was made, not only marked.
          Its metadata LV may still be there (the finalization died
          before removing it): the driver maps no linear handle over an
          LV beside its metadata LV, and the abandon removes that LV
          before it maps one, so only the swap leaves both;
        * the volume record still names this move's export on the
          source (``provider_location``): a finalization forgets it once
          the source retired (Store.forget_source_export), so a copy
          saved long after the move finished, or over a later one,
          never passes;
        * nothing here names another move (:meth:`_other_move`).

        A reboot takes the handle: with the metadata LV still there the
        clone is built again (:meth:`rewound_state`); without it the
        swapped copy can no longer be told from a clone that lost its
        metadata LV (partly copied), and the move is kept for an
        operator, as before.
        """
        clones = self.clones
        return (self.ended_here(t, move.END_SWAP)
                and clones.has_data(t) and clones.swapped(t)
                and self.names_source_export(volume, t)
                and self._other_move(t) is None)

    def _roll_back_emptied(self, volume, t):
        """Finish the rollback a set-back record hides (R16-1).

        The rollback's teardown ran here, then the service died before
        it pointed the record back at the source, and a stale whole save
        set the move back to ``preparing``: nothing here can be rolled
        forward, and the instance writes the source's copy.  The move is
        given back the state only a rollback leaves that way
        (``cloned``, by a compare-and-set on this very move,
        ``preparing``: Store.roll_forward), then rolled back as a
        ``cloned`` move whose teardown had begun
        (:meth:`roll_back_unless_written`): the record points at the
        source again, its export for this node goes, the move is
        cleared.  A crash anywhere leaves either the set-back record
        (this again at the next start) or the one a cut rollback leaves
        (``cloned``: ROLL_BACK at the next start here, or the source's
        finish_rollback once the record names it).  Never a commit: the
        state written is ``cloned``, and a move in ``cloned`` without a
        data LV here is only ever rolled back.
        """
        try:
            self.store.roll_forward(self.ctxt(), t, move.CLONED)
        except move.MoveStateConflict:
            return      # (changed since the read: nothing to do)
        self.prepare_seen.pop(t.volume_id, None)
        self.rewound_reported.pop(t.volume_id, None)
        LOG.warning('Volume %(vol)s lives on this node by its record, but '
                    'this node holds no copy of it, and its move from '
                    '%(src)s was recorded as preparing again (a stale copy '
                    'of its admin metadata saved whole): a rollback of the '
                    'move was cut short after its teardown here; '
                    'finishing it, the volume stays on %(src)s.',
                    {'vol': t.volume_id, 'src': t.source_node})
        self.roll_back_unless_written(volume, t)

    def rewound_state(self, t):
        """The state move ``t``, set back to ``preparing``, had: or why not.

        Returns ``(state, None)`` or ``(None, reason)``.  Read from this
        node's clone, which no write of the record changes and no volume
        owner can reach:

        * hydration on in the loaded clone: ``hydrating``.  Only a
          committed move hydrates: a clone is built hydrating only when
          its source found no attachment that may use its copy, and
          hydration is turned on only by a commit (after the source
          confirmed its copy closed) or for a committed move.
        * a clone thin mapped here (:meth:`was_mapped`, this node's own
          mark outlives the save): ``hydrating``; a map is only ever
          applied to a move that hydrates at once.  Its guard keeps it
          from copying while the pool does not zero.
        * else ``cloned``, with hydration off: the live migration's
          window, where the source may still write, or a committed move
          whose clone a reboot took (and with it whether it hydrated).
          Never hydrating then: ``cloned`` commits only on the source's
          word that no instance there holds its copy any more
          (:meth:`commit_pending`), a short wait at worst, while a move
          skipping that window would copy regions the source writes
          again, and its finalization retire them.

        Nothing tells it without the clone's metadata LV (a move that
        finished and was cleared before the save, or a clone that lost
        it), nor from a clone whose status cannot be read or that has
        another geometry than the record: such a move is not rolled
        forward (finalizing it could retire the only whole copy).  Nor
        when the clone here may be another move's (:meth:`_other_move`:
        the saved copy may be older than a move given up before this
        one), nor for a record without a secret.
        """
        clones = self.clones
        if not (clones.has_data(t) and clones.has_metadata(t)):
            return None, ('its data LV or its dm-clone metadata LV is not '
                          'on this node')
        other = self._other_move(t)
        if other is not None:
            return None, other
        if clones.needs_rebuild(t):
            return (move.HYDRATING if self.was_mapped(t)
                    else move.CLONED), None
        try:
            status = clones.clone_status(t)
        except dmc_exception.InvalidTable as exc:
            return None, str(exc)
        if status.region_size != t.region_sectors or \
                status.total_regions != dmsetup.region_count(
                    t.clone_sectors, t.region_sectors):
            return None, ('its clone here has %d regions of %d sectors, '
                          'not the record\'s'
                          % (status.total_regions, status.region_size))
        if status.hydration_enabled or self.was_mapped(t):
            return move.HYDRATING, None
        return move.CLONED, None

    def _other_move(self, t):
        """Why the clone here may belong to another move than ``t``; or None.

        A copy saved long after it was read can set back a move given up
        before the one that built this clone: the rolled forward record
        would then describe another clone, and a rebuild for it would
        drop that clone's thin-mapped mark, and its guard with it
        (:meth:`_drop_stale_node_mark`).  What names another move: the
        last prepare of the volume this process ran (each prepare here
        records its move: :attr:`prepare_seen`), and this node's own
        mark (one it cannot read may be another's).
        """
        vid = t.volume_id
        if not t.secret:
            return 'its record has no secret (an older release\'s)'
        seen = self.prepare_seen.get(vid)
        if seen is not None and seen[0] != t.secret:
            return 'this service built the clone here for another move'
        if self.marks is None:
            return None
        try:
            value = self.marks.read(vid)
        except map_mark.MarkNameInvalid:
            return None
        except Exception as exc:
            return 'its thin-mapped mark here cannot be read (%s)' % exc
        if value is not None and not map_mark.same_tag(
                value, move.thin_map_tag(t.secret)):
            return 'its thin-mapped mark here names another move'
        return None

    def _stop_kept_copy(self, t):
        """A set-back move kept as it is: stop a copy its pool makes unsafe.

        The monitor applies the thin map's guard to ``hydrating`` moves
        only (:meth:`guard_pool_zeroing`).  A move kept ``preparing``
        whose clone hydrates and may be thin mapped (its record, this
        service or this node marks a clone of the volume, or a mark
        cannot be read) has its hydration turned off while the pool does
        not zero new blocks;
        never on: that waits for the record to be corrected.
        """
        try:
            status = self.clones.clone_status(t)
        except dmc_exception.InvalidTable:
            return
        if not status.hydration_enabled or status.fully_hydrated:
            return
        # (Not was_mapped: it would write this move's mark over another
        # move's.)
        if not (t.thin_mapped or t.volume_id in self.mapped
                or self._any_mark(t.volume_id)):
            return
        why = self._pool_not_zeroing()
        if why is None:
            return
        self.clones.disable_hydration(t)
        LOG.error('Volume %(vol)s: stopped hydrating its clone, whose move '
                  'is kept as recorded (preparing): its regions may have '
                  'been marked copied by a thin map, and thin pool '
                  '%(vg)s/%(pool)s does not zero new blocks (%(why)s).',
                  {'vol': t.volume_id, 'vg': self.clones.vg.vg_name,
                   'pool': self.clones.thin_pool, 'why': why})

    def _any_mark(self, volume_id):
        """True if this node marks a clone of the volume (or cannot tell)."""
        if self.marks is None:
            return False
        try:
            return self.marks.read(volume_id) is not None
        except map_mark.MarkNameInvalid:
            return False
        except Exception:
            return True

    def _report_rewound(self, volume, t, why):
        """Say, once per move, that a set-back record is kept as it is."""
        if not self._first_report(self.rewound_reported, t):
            return
        LOG.error('Volume %(vol)s lives on this node by its record, but its '
                  'move from %(src)s is recorded as preparing: the record '
                  'was rewound (a stale copy of its admin metadata saved '
                  'whole), and it cannot be rolled forward: %(why)s.  '
                  'Nothing is removed on either node.  Check both with '
                  '"cinder-dmclone status"; if the move had finished (no '
                  'clone here, the LV complete), remove its dmclone_* '
                  'admin metadata keys, else set dmclone_state to the '
                  'state it had.',
                  {'vol': volume['id'], 'src': t.source_node, 'why': why})

    def drop_aborted(self, volume, t):
        """Remove what an aborted move built here, and forget it."""
        LOG.warning('Transfer of volume %(vol)s from %(src)s was aborted; '
                    'removing what was built here.',
                    {'vol': volume['id'], 'src': t.source_node})
        self.tear_down(volume, t)
        self.end_part(volume['id'], t)
        self.store.clear(self.ctxt(), volume['id'], t)

    # -- the live migration's outcome ---------------------------------------

    def detached(self, volume, connector):
        """A connection of a volume moving here goes away.

        Detach on the source (live migration done): commit, hydrate --
        once the source confirms that no instance there holds its copy
        any more (:meth:`commit_once_closed`).
        Detach here while the source still holds it (live migration
        failed): roll back; the volume stays on the source -- unless the
        clone already took writes here (see :meth:`hold`).
        Returns True if the move handled it.

        A detach here of a move whose record was set back to
        ``preparing`` after its commit (R14-4) rolls it forward first
        (:meth:`roll_forward`), under the volume's lock: taken for
        nothing, it would leave a failed live migration ``cloned``, held
        by the source's attachment, once the monitor rolled it forward
        (R16-2).  (The source's detach is left to the monitor's commit.)
        """
        host = (connector or {}).get('host')
        t = self.load(volume['id'])
        if not self.is_dest(t) or host is None:
            return False
        set_back = (t.state == move.PREPARING and host in self.node_names
                    and self.named_here_while_preparing(volume, t))
        if t.state != move.CLONED and not set_back:
            # The source's detach again, after the commit was recorded (a
            # retry after this service died before answering): its
            # connection ended with the commit, nothing is exported here.
            return host in t.source_names
        with move.lock(volume['id']):
            # Read again under the lock: the move may have been committed
            # or rolled back by a detach that held it first.
            t = self.load(volume['id'])
            if set_back and self.is_dest(t) and t.state == move.PREPARING:
                t = self.roll_forward(volume, t) or t
            if not self.is_dest(t) or t.state != move.CLONED:
                return self.is_dest(t) and host in t.source_names
            current = attachments.current(volume)
            on_source = attachments.on(volume, t.source_names, current)
            if host in t.source_names:
                # (A reserved attachment with no host is not counted: see
                # Source._may_be_used_here.)
                if on_source <= 1:
                    self.commit_once_closed(volume, t)
                return True
            if host in self.node_names and on_source > 0:
                self.roll_back_unless_written(volume, t)
                return True
            if host in self.node_names and self.clones.lost_metadata(t):
                # The source detached first: the instance most likely ran
                # here and wrote, which the source's copy lacks.
                self.hold_without_metadata(volume, t)
                return True
        return False

    def detached_at_source(self, volume):
        """A detach of this node's connection reached the source (a step).

        Cinder routes a detach by the volume record cinder-api read: one
        read before a live migration's commit (Nova rolling back a
        migration whose pre_live_migration on this node answered late
        deletes this node's attachment) reaches the source, which keeps
        its export's ACLs (Source.keeps_acl) and passes the detach on
        (Source.pass_on_detach).  It is handled as if it had come here
        (:meth:`detached`, with this node's name), under the volume's
        lock: a move in ``cloned`` with an attachment on the source is
        rolled back unless the clone took writes, which is held instead
        (:meth:`roll_back_unless_written`; a clone still open here
        cannot be removed either), a record set back to ``preparing``
        is rolled forward first; anything else is left as it is.  It
        grants nothing a detach sent here does not: a volume's owner can
        send one here with this node's connector through the API.
        """
        self.detached(volume, {'host': self.node_name})

    def _send_to_source(self, ctxt, volume, t, op):
        """Send a step to the source; a timeout makes it rest (see above)."""
        try:
            self.send(ctxt, volume, t, t.source_host, op)
        except oslo_messaging.MessagingTimeout:
            self.rest_source(t)
            raise
        self.resting.pop(t.source_node, None)
        self.yielding.pop(t.source_node, None)
        self.waited.pop(t.source_node, None)

    def rest_source(self, t):
        """Leave the source of ``t`` alone for a while: it did not answer.

        (A step to it timed out, or a login to its export failed.)
        """
        self.resting[t.source_node] = self._clock() + self.PEER_REST
        self.yielding[t.source_node] = t.volume_id
        self.waited.pop(t.source_node, None)

    def source_resting(self, t):
        """True while the monitor leaves the move's source alone.

        After the rest, if other moves waited for that source meanwhile,
        the volume whose step timed out last waits once more: the monitor
        serves its moves in the same order at every tick, and a step that
        always times out (its source answers the others) would otherwise
        come first again each time and keep every other move from that
        source waiting for good.
        """
        src = t.source_node
        if self.resting.get(src, 0) > self._clock():
            if t.volume_id != self.yielding.get(src):
                self.waited[src].add(t.volume_id)
            return True
        if (self.yielding.get(src) == t.volume_id
                and self.waited.get(src)):
            del self.yielding[src]
            return True
        return False

    def commit_once_closed(self, volume, t):
        """Commit if the source confirms its copy is closed; else wait.

        The caller holds the volume's lock and found the source detached.
        Nova closes the source's copy before it deletes the source's
        attachment; an attachment removed while an instance there still
        runs (an owner's attachment delete or ``os-detach`` during a live
        migration) is not that, and committing then would hydrate this
        node from a copy that still changes and later retire it with
        every write made since.  So the source is asked
        (:meth:`~cinder_dmclone.source.Source.confirm_closed`).  A refusal
        or no answer (the source's service restarting) keeps the move in
        ``cloned``, hydration off, reads going to the source: the detach
        itself succeeds, as Nova would not retry it, and the monitor asks
        again at each tick (:meth:`commit_pending`).  A clone that lost
        its metadata LV never commits (no clone can be built over its data
        LV again; logged once): the move waits in ``cloned``; a detach
        here then keeps it for an operator (:meth:`hold_without_metadata`),
        never rolls it back.  Returns True once
        committed.  Never for a record this node's own mark contradicts
        (MoveContradicted): the clone here may be another move's.
        """
        self.refuse_if_contradicted(volume['id'], t, 'a commit')
        if self.clones.lost_metadata(t):
            # No clone can be built again here: nothing to hydrate, and
            # the source's copy stays the only whole one.  Said once.
            if volume['id'] not in self.held:
                LOG.error('%s', self.clones.metadata_lost(t).msg)
            self.held.add(volume['id'])
            return False
        try:
            self._send_to_source(self.ctxt(), volume, t, peer.CLOSED)
        except Exception as exc:
            if volume['id'] not in self.awaiting_source:
                LOG.warning('Volume %(vol)s was detached on %(src)s, but '
                            '%(src)s does not confirm that no instance '
                            'there uses it any more (%(why)s): its move '
                            'is not committed; asking again at each '
                            'monitor tick.', {'vol': volume['id'],
                                              'src': t.source_node,
                                              'why': exc})
                self.store.mark_awaiting_source(self.ctxt(), t)
            self.awaiting_source.add(volume['id'])
            return False
        self.commit(volume, t)
        return True

    def commit_pending(self, volume_id):
        """A move in ``cloned`` that no source attachment holds commits.

        The monitor's retry of :meth:`commit_once_closed`, also the way a
        start commits a move whose source detach the last run did not
        finish (recovery never commits without the source's word).  Only
        active attachments on the source hold it, not one reserved with
        no host (an orphan of a failed ``attachment_create`` would hold
        it for ever; why none can be a local attach there, see
        Source._may_be_used_here).  The hold is logged once per move,
        naming the attachments.
        """
        with move.lock_if_free(volume_id) as locked:
            if not locked:
                return False    # busy: the next tick asks
            t = self.load(volume_id)
            if not self.is_dest(t) or t.state != move.CLONED:
                self.awaiting_source.discard(volume_id)
                return False
            if self.source_resting(t):
                return False
            volume = objects.Volume.get_by_id(self.ctxt(), volume_id)
            current = attachments.current(volume)
            holding = attachments.holding(volume, t.source_names, current)
            if holding:
                if self._attach_here_withdrawn(volume, t, current):
                    self.roll_back_unless_written(volume, t)
                    return False
                self._report_held(t, holding, attachments.holding(
                    volume, self.node_names, current))
                return False
            return self.commit_once_closed(volume, t)

    def _attach_here_withdrawn(self, volume, t, current):
        """True if no attachment may be the one move ``t`` was made for.

        A live migration's move stays ``cloned`` while the source's
        attachment and this node's both exist.  This node's can go with
        no detach reaching any driver: Nova deletes an attachment whose
        attach timed out, and Cinder sends nothing for one still reserved
        (no connector saved yet).  A withdrawal after the source's last
        check (Source._refuse_if_attach_withdrawn) left the move cloned,
        refusing snapshots, extends and moves, for as long as the
        instance ran on the source, then committed it here where nothing
        used it (review 20 F2); a detach the source passed on and this
        node failed did the same (F3).  So the monitor rolls such a move
        back, as a detach here would (never a clone that took writes).
        Any attachment in use here, or reserved without a host yet (it
        may be the move's own), keeps the move; so does a move already
        held for its writes (:meth:`hold`), and a clone something here
        still has open (an instance Nova took for gone: the rollback
        could not remove it, and would be tried again at every tick),
        which is reported once.
        """
        if volume['id'] in self.held or \
                attachments.may_be_on(volume, self.node_names, current):
            return False
        if self.clones.loaded(t) and self.clones.open_count(t) > 0:
            if self._first_report(self.open_reported, t):
                LOG.warning('Volume %(vol)s: no attachment on %(dst)s is '
                            'left, but its clone here is open: the move is '
                            'not rolled back while it is (its source\'s '
                            'attachment holds it).',
                            {'vol': t.volume_id, 'dst': t.dest_node})
            return False
        return True

    @staticmethod
    def _first_report(reported, t):
        """True the first time move ``t`` is reported in ``reported``.

        ``reported`` maps a volume id to the secret of the move last
        reported, so a later move of the volume is reported again.
        """
        if reported.get(t.volume_id) == t.secret:
            return False
        reported[t.volume_id] = t.secret
        return True

    def _report_held(self, t, holding, here=()):
        """Say once per move which attachments on its source hold it.

        And which on this node keep it from rolling back: one left by an
        attach whose call timed out (Cinder finished it after Nova gave
        up, so Nova never uses or deletes it) is the one to delete.
        """
        if not self._first_report(self.held_reported, t):
            return
        LOG.warning('Volume %(vol)s stays cloned on %(dst)s, not hydrating '
                    'and read from %(src)s, while attachment(s) %(ids)s on '
                    '%(src)s use the copy there (a live migration until '
                    'its source detach). It commits once they are '
                    'detached; an attachment no instance uses is cleared '
                    'with "cinder attachment-delete <id>". Attachment(s) '
                    'on %(dst)s: %(here)s (deleting the one of an attach '
                    'that timed out rolls the move back).',
                    {'vol': t.volume_id, 'dst': t.dest_node,
                     'src': t.source_node, 'ids': ', '.join(holding),
                     'here': ', '.join(here) or 'none in use'})

    def publish_progress(self, t, progress):
        """Record a clone's progress while its move still goes on.

        The monitor read the move before this tick's other work; a
        rollback, abort, delete or finalization holding the lock meanwhile
        may have ended it and cleared its record.  Progress written after
        that would describe a move that no longer exists, so it is
        written under the lock, compare-and-set on the move, and only if
        the lock is free now (see :func:`move.lock_if_free`).  Returns
        False if the move ended, None if the lock was busy.
        """
        with move.lock_if_free(t.volume_id) as locked:
            if not locked:
                return None
            try:
                current = self.load(t.volume_id)
            except exception.VolumeNotFound:
                return False    # deleted meanwhile
            if not self.is_dest(current) or not t.still(current):
                return False
            self.store.publish_progress(self.ctxt(), t.volume_id, progress)
            return True

    def hold(self, volume, t):
        """Keep a clone that took writes although the source is attached.

        The instance ran here (a live migration switched over), so the
        clone holds its latest writes; the source's attachment outlived
        the migration (its compute died before cleaning up, or its detach
        failed).  Rolling back would discard every write since the switch,
        and committing would hydrate under a source that may still write.
        Neither is safe without an operator: the move waits in ``cloned``
        and is reported until the stale attachment is removed, which
        commits it.
        """
        self.held.add(volume['id'])
        self.drop_end_mark(volume['id'])
        self.store.mark_stale_source_attachment(self.ctxt(), t)
        LOG.error('Volume %(vol)s was detached on %(dst)s, where it took '
                  'writes, while node %(src)s still has an attachment: the '
                  'move is kept (not rolled back) so that no write is '
                  'lost, with hydration off. If no instance on %(src)s '
                  'uses the volume any more, delete that attachment '
                  '(openstack volume attachment delete): the move then '
                  'commits and hydrates.',
                  {'vol': volume['id'], 'dst': t.dest_node,
                   'src': t.source_node})

    def hold_without_metadata(self, volume, t):
        """Keep a move whose clone lost its metadata, detached here last.

        The source's attachment went first (Nova's detach after the
        switch-over): the instance most likely ran here and wrote, and
        which regions only the lost metadata said.  Rolling back would
        make the source's stale copy the volume and leave the writes in
        an LV nobody reads; nothing is rolled back, wiped or committed:
        the move stays in ``cloned``, naming this node, for an operator.
        """
        self.held.add(volume['id'])
        LOG.error('Volume %(vol)s was detached on %(dst)s after %(src)s had '
                  'detached it (its instance most likely switched over and '
                  'wrote here), but its clone lost its metadata LV %(meta)s: '
                  'the move is kept in "cloned", neither rolled back to '
                  '%(src)s\'s older copy nor committed, and LV %(lv)s here is '
                  'kept. An operator must decide which copy is the volume '
                  '(see the operations guide: a move whose destination lost '
                  'its metadata LV).',
                  {'vol': volume['id'], 'dst': t.dest_node,
                   'src': t.source_node, 'lv': t.lv_name,
                   'meta': layout.metadata_lv_name(t.lv_name)})

    def commit(self, volume, t):
        self.clones.enable_hydration(t)
        self.store.transition(self.ctxt(), t, (move.CLONED,),
                              move.HYDRATING)
        self.store.clear_waits(self.ctxt(), volume['id'])
        self.held.discard(volume['id'])
        self.awaiting_source.discard(volume['id'])
        self.drop_end_mark(volume['id'])
        LOG.info('Transfer of volume %(vol)s committed: hydrating from '
                 '%(src)s.', {'vol': volume['id'], 'src': t.source_node})

    def rollback(self, volume, t, keep_data=False):
        """The volume stays on the source; what was built here goes.

        With ``keep_data`` the clone's data LV stays, neither wiped nor
        mapped (see :meth:`roll_back_without_metadata`).
        """
        ctxt = self.ctxt()
        self.refuse_if_contradicted(volume['id'], t, 'a rollback')
        LOG.warning('Rolling back the transfer of volume %(vol)s: it stays '
                    'on %(src)s.', {'vol': volume['id'],
                                    'src': t.source_node})
        self._mark_rollback(t)
        self.tear_down(volume, t, keep_data=keep_data)
        self.store.move_volume(ctxt, volume['id'], t.source_host,
                               source.host_zone(ctxt, t.source_host))
        try:
            self.send(ctxt, volume, t, t.source_host, peer.RELEASE)
        except Exception:
            LOG.exception('Source %(src)s did not drop the export of '
                          '%(vol)s; it is harmless and goes with the next '
                          'detach there.', {'src': t.source_node,
                                            'vol': volume['id']})
        self.end_part(volume['id'], t)
        self.store.clear(ctxt, volume['id'], t)
        self.drop_end_mark(volume['id'])

    def _mark_rollback(self, t):
        """The end mark of a rollback about to tear down (:meth:`mark_end`).

        A mark that cannot be written is logged, and the rollback goes
        on: without it a rollback cut short and then set back is only
        kept for an operator (:meth:`_emptied`).
        """
        try:
            self.mark_end(t, move.END_ROLLBACK)
        except Exception:
            LOG.error('Volume %(vol)s: the mark of its rollback could not '
                      'be written here; should the rollback be cut short '
                      'and its record set back, the move is kept for an '
                      'operator.', {'vol': t.volume_id}, exc_info=True)

    def roll_back_unless_written(self, volume, t):
        """Roll a move in ``cloned`` back, unless the clone took writes.

        The clone is rebuilt first (hydration off) when a reboot, or a
        crash in an earlier rollback's teardown, took it: only the clone
        tells whether the instance already wrote here, and a clone that
        took writes is never rolled back (see :meth:`hold`).  A missing
        data LV means a rollback's teardown already began: nothing is
        left to keep, and the rollback is finished.

        Which LVs are here is LVM's own listing (Clones.listed), never
        brick's lookup, which reads a volume group not found (a PV not
        scanned yet after a reboot) as "no such LV": a group LVM cannot
        list raises LVMUnlisted before anything is done, and the move
        stays as it is.  A record this node's own mark contradicts
        raises MoveContradicted, nothing done (its handle here may be
        another move's).
        """
        self.refuse_if_contradicted(volume['id'], t, 'a rollback')
        clones = self.clones
        data, meta = clones.listed(t)
        loaded = clones.loaded(t)
        if data and not meta and not loaded:
            self.roll_back_without_metadata(volume, t)
            return
        if data or loaded:
            if not loaded:
                self.rebuild(volume, t, hydrate=False)
            if clones.written(t):
                self.hold(volume, t)
                return
        self.rollback(volume, t)

    def roll_back_without_metadata(self, volume, t):
        """Roll back a move whose clone lost its metadata LV; keep its LV.

        Its destination detached while the source still has its
        attachment (Nova's rollback of the live migration; after the
        source's detach see :meth:`hold_without_metadata`): no clone
        can ever be built here again
        (:meth:`~cinder_dmclone.clone.Clones.lost_metadata`), so the move
        cannot commit, and only the source holds a whole copy.  Nothing
        tells whether the instance ever wrote here (after a switch-over
        whose source attachment outlived it): the data LV is kept,
        neither wiped nor mapped, for an operator -- and as a copy no
        move built, it keeps any later move here refused until it is
        removed (:meth:`refuse_if_lost_copy`).
        """
        # The keep is recorded before the volume record stops naming this
        # node: if the rollback is cut short after that, the source's
        # abort of the same move (finish_rollback, its restart) meets the
        # key and keeps the LV (tear_down), and a start here reports it.
        self.store.record_old_copy(self.ctxt(), volume['id'],
                                   self.node_name, t.lv_name)
        LOG.error('Volume %(vol)s is rolled back to %(src)s although its '
                  'clone here had lost its metadata LV %(meta)s: which '
                  'regions of LV %(lv)s the instance wrote here, if it ever '
                  'ran here, is unknown. The volume is %(src)s\'s copy, '
                  'whole up to the moment the instance would have switched '
                  'over. LV %(lv)s on %(dst)s is kept, not wiped: if the '
                  'instance never ran on %(dst)s (check its migration '
                  'history) remove it (lvremove); else recover what it '
                  'needs from it first. Until it is removed the volume '
                  'cannot move to %(dst)s.',
                  {'vol': volume['id'], 'src': t.source_node,
                   'dst': t.dest_node, 'lv': t.lv_name,
                   'meta': layout.metadata_lv_name(t.lv_name)})
        self.rollback(volume, t, keep_data=True)
        self.held.discard(volume['id'])
        self.awaiting_source.discard(volume['id'])

    def rebuild(self, volume, t, hydrate):
        """Build the clone again after a restart or reboot took it.

        A clone thin mapped here gets its guard back at once
        (:meth:`guard_pool_zeroing`): built without hydration while its
        pool does not zero, and one that a restart left loaded stops
        hydrating then, before the monitor's first tick.

        SourceUnreachable if the login to the source's export fails (see
        Recovery.retry_rebuilds); CloneMetadataLost, before anything is
        done, if the metadata LV is gone (never a clone without it); any
        other failure is this node's.
        """
        if not self.clones.has_metadata(t):
            exc = self.clones.metadata_lost(t)
            LOG.error('%s', exc.msg)
            raise exc
        threshold, batch = self.tuning(volume.volume_type)
        try:
            path = self.clones.connect_source(t, volume.provider_auth)
        except Exception as exc:
            raise dmc_exception.SourceUnreachable(
                volume=volume.id, node=t.source_node, reason=exc) from exc
        self._drop_stale_node_mark(t)
        guarded = self._guarded(t)
        self.clones.build_clone(
            t, path, hydrate and not (guarded and self._stop_for_pool(t)),
            threshold, batch)
        if guarded:
            self._guard_at_start(t)

    def _drop_stale_node_mark(self, t):
        """Remove this node's mark of another move of ``t``'s volume.

        It guards nothing (it is inert: :meth:`_marked_here`), and the
        clone built again here is ``t``'s.  Only while no prepare of the
        volume runs in this process (:attr:`building`), whose mark may
        be newer than the record read here.  A mark that cannot be read
        stays (:meth:`was_mapped` reports it).
        """
        if self.marks is None or t.volume_id in self.building:
            return
        try:
            value = self.marks.read(t.volume_id)
        except Exception:
            return
        if value is None or (t.secret and map_mark.same_tag(
                value, move.thin_map_tag(t.secret))):
            return
        LOG.info('Volume %s: removing a thin-mapped mark here left by an '
                 'earlier move of it.', t.volume_id)
        self.drop_node_mark(t.volume_id)

    def _guarded(self, t):
        """True if move ``t``'s clone hydrates only while its pool zeroes.

        A clone thin mapped here (the record's mark, :meth:`was_mapped`)
        that still copies: a move ``finalizing`` copies nothing more.
        """
        return t.state == move.HYDRATING and self.was_mapped(t)

    def _guard_at_start(self, t):
        """Apply the pool's guard to mapped clone ``t`` now, not at a tick.

        A restart of the service alone leaves the clone loaded and
        hydrating: without this it would copy until the monitor's first
        tick.  A clone whose status cannot be read (``Fail``) copies
        nothing; the monitor reports it.
        """
        try:
            status = self.clones.clone_status(t)
        except dmc_exception.InvalidTable:
            LOG.warning('Volume %s: the status of its clone cannot be read '
                        'at start; the monitor checks its thin pool\'s '
                        'zeroing at each tick.', t.volume_id, exc_info=True)
            return
        self.guard_pool_zeroing(t.volume_id, t, status)

    def _stop_for_pool(self, t):
        """True (logged) if a mapped clone built now must not hydrate.

        A reboot took the clone: it is built again with hydration off
        while its pool does not zero new blocks, never on for a moment
        (the kernel would start copying at once); the monitor's guard
        starts it once the pool zeroes.
        """
        why = self._pool_not_zeroing()
        if why is None:
            return False
        LOG.error('Volume %(vol)s: its clone is built again with hydration '
                  'off: thin pool %(vg)s/%(pool)s does not zero new blocks '
                  '(%(why)s), and regions of this clone were marked copied '
                  'without a copy (its thin map). Turn the pool\'s zeroing '
                  'back on (lvchange --zero y %(vg)s/%(pool)s); hydration '
                  'starts at the next check.',
                  {'vol': t.volume_id, 'vg': self.clones.vg.vg_name,
                   'pool': self.clones.thin_pool, 'why': why})
        return True

    # -- what else can happen to a volume moving here ----------------------

    def extend(self, volume, grow):
        """Extend a volume of this node, in one critical section.

        Under the volume's lock, which every step of a move and
        ``cinder-dmclone move abandon-source`` hold for their whole work:
        the move is read, an extend it forbids is refused
        (:meth:`refuse_extend_while_undecided`) before anything grows,
        ``grow()`` extends the LV, and the table of a clone moving here
        is extended (clone + linear tail): True.  False when no clone
        here owns the table (no move here, or a finalizing one): the
        caller refreshes the linear handle.  So no step of a move sees
        the LV grow between its own reads, and an abandon's scan,
        zeroing and linear map cover one size.  A move here whose record
        a stale save set back to ``preparing`` is rolled forward first
        (:meth:`rolled_forward`): committed, it is extended as any
        hydrating move, never refused for a state it no longer has.
        """
        with move.lock(volume['id']):
            t = self.rolled_forward(volume, self.load(volume['id']))
            if t is None:
                # The caller's volume object may predate a rollback that
                # this waited for, which kept an LV here named like the
                # volume (roll_back_without_metadata): only the record as
                # it is now says whether the volume lives here.
                self.refuse_unless_here(volume, _('an extend'))
            self.refuse_extend_while_undecided(volume, t)
            self.refuse_extend_without_clone(volume, t)
            grow()
            if not self.is_dest(t) or t.state == move.FINALIZING:
                return False
            return self.clones.extend(t)

    def refuse_extend_without_clone(self, volume, t):
        """MoveInProgress if the clone of committed move ``t`` is not loaded.

        After a restart whose clone could not be rebuilt (its source
        does not answer, or is lost), the LV would grow with no table to
        extend: the extend would then fail with the LV already grown,
        Cinder keep the old size, and a later linear map (the
        finalization, or abandon-source) show the instance more than
        its record says.  Refused before anything grows; possible again
        once the clone is rebuilt or the move has ended.
        """
        if (self.is_dest(t) and t.state == move.HYDRATING
                and not self.clones.loaded(t)):
            self.raise_moving(volume, t, _('an extend (its clone is not '
                                           'loaded on this node)'))

    def refuse_extend_while_undecided(self, volume, t):
        """MoveInProgress if move ``t`` (read under the lock) forbids it.

        In ``cloned`` the move may still be rolled back to the source,
        whose LV has the old size: the volume record would then claim a
        size its LV does not have.  In ``preparing`` the destination
        builds a clone of the old size.  Once the move is committed the
        destination's LV is the volume, and an extend there is mapped
        linearly past the clone; an extend reaching the source (its
        record not yet repointed) is refused.  In ``source_lost`` an
        operator is ending the move: refused until the command finished
        (it ends with the volume in ``error``, which Cinder does not
        extend).
        """
        if t is not None and t.state in (move.PREPARING, move.CLONED):
            self.raise_moving(volume, t, _('an extend (the live migration '
                                           'is not decided yet)'),
                              percent='0.0')
        if t is not None and t.state in (move.HYDRATING, move.FINALIZING) \
                and self.is_source(t):
            # (Routed here by a record that still names the source after
            # a lost database write: the LV here is no longer the volume.
            # The destination names itself when it finalizes.)
            self.raise_moving(volume, t, _('an extend (its record names '
                                           'the node it left)'))
        if t is not None and t.state == move.SOURCE_LOST:
            self.raise_moving(volume, t, _('an extend (its lost source is '
                                           'being abandoned)'))

    def rolled_forward(self, volume, t):
        """``t``, rolled forward first if its record was set back here.

        The caller holds the volume's lock and read ``t`` under it.  A
        move to this node still ``preparing`` then is no prepare running
        (its source holds the lock until it records the outcome), so it
        is either one set back after its commit, which
        :meth:`roll_forward` rolls forward, or one left by a failed
        attempt, returned as it is.  Any other ``t`` (None too) is
        returned as it is.
        """
        if self.is_dest(t) and t.state == move.PREPARING:
            return self.roll_forward(volume, t) or t
        return t

    def retune(self, volume, volume_type):
        """Apply a new volume type's hydration tuning to a live clone.

        A move here recorded ``preparing`` is rolled forward first, under
        the volume's lock (:meth:`rolled_forward`): set back by a stale
        save, its clone is live, and the retype's tuning would otherwise
        never reach it.
        """
        t = self.load(volume['id'])
        if self.is_dest(t) and t.state == move.PREPARING:
            with move.lock(volume['id']):
                t = self.rolled_forward(volume, self.load(volume['id']))
        if self.is_dest(t) and t.state in (move.CLONED, move.HYDRATING):
            threshold, batch = self.tuning(volume_type)
            self.clones.tune(t, threshold, batch)

    def delete(self, volume):
        """A volume moving here is deleted: clean both nodes.

        Returns False when the caller still has to delete the volume's LV
        here (no move into this node), once the volume record, read then,
        names this node (:meth:`refuse_delete_unless_here`): a move that
        ended while this waited for the lock may have been a rollback
        that kept the LV here, named like the volume, and pointed the
        record at the source.

        A record that this node's own mark contradicts (a stale save
        replaced the record of the move into this node) is restored
        first (:meth:`restore_contradicted`), so that both copies go;
        if it cannot be, MoveContradicted, nothing removed.  Otherwise a
        delete keeps nothing for any move: the teardown here is not
        refused by a mark, the retire tells the source it is a delete
        (peer.DELETING: it removes every copy it holds, see
        peer.Endpoint.deleting), and this node's mark goes.
        """
        t = self.load(volume['id'])
        if not self.is_dest(t) and not self._moving_here_by_mark(volume):
            self.refuse_delete_unless_here(volume)
            return False
        ctxt = self.ctxt()
        with move.lock(volume['id']):
            self._restore_before(volume, _('a delete'))
            t = self.load(volume['id'])
            if not self.is_dest(t):
                self.refuse_delete_unless_here(volume)
                return False
            # (A move recorded preparing whose record names this node was
            # set back after its commit: what is here is the volume.  A
            # group LVM cannot list: nothing removed here, the source
            # keeps its copy, the move stays; the delete fails.)
            with self.refused_while_unlisted(volume, _('its delete')):
                self._remove_built(volume, t, deleted_here=(
                    t.state == move.PREPARING
                    and self.named_here_while_preparing(
                        objects.Volume.get_by_id(ctxt, volume['id']), t)))
            try:
                self.send(ctxt, volume, t, t.source_host, peer.RETIRE,
                          deleting=True)
            except Exception:
                with excutils.save_and_reraise_exception():
                    LOG.error('Volume %(vol)s: its side here is removed, '
                              'but its source %(src)s did not retire its '
                              'old copy; the move stays recorded and the '
                              'delete fails. If %(src)s is lost for good, '
                              'run "cinder-dmclone move abandon-source '
                              '%(vol)s" on this node (with the volume in '
                              'error: cinder reset-state), then delete it '
                              'again.', {'vol': volume['id'],
                                         'src': t.source_node})
            self.end_every_part(volume['id'])
            self.store.clear(ctxt, volume['id'], t)
            self.pending_finalize.discard(volume['id'])
            self.held.discard(volume['id'])
        return True

    def drop_for_delete(self, volume):
        """A delete reached this node as a retire: a marked clone goes too.

        This node's mark names it the destination of a move that the
        record no longer names (a stale whole save replaced it, and its
        source gave it up or its abort never came): what was built here
        for it goes, wiped, under the build lock, with its mark.  Nothing
        of a deleted volume is kept for any move.  No mark, or one
        naming this node a source: nothing here (the retire does the
        rest).
        """
        if self.evidence is None:
            return
        part = self.evidence.read(volume['id'])
        if part is None or part.role != evidence.DESTINATION:
            return
        LOG.warning('Volume %(vol)s is deleted: removing, wiped, what was '
                    'built here for the move this node\'s mark names (the '
                    '%(part)s), which its record no longer names.',
                    {'vol': volume['id'], 'part': part.describe()})
        with move.build_lock(volume['id']):
            self._remove_built(volume, part.move, deleted_here=True)
        self.end_every_part(volume['id'])

    def drop_deleted(self, volume_id, t):
        """Remove, wiped, the clone move ``t`` built here for a deleted volume.

        The volume is gone and only this node's mark (as the move's
        destination) names the move: recovery checked that no live
        volume, move record or other mark names its data LV
        (:func:`~cinder_dmclone.recovery.plan_deleted`).  Its clone goes
        as a teardown removes it (the data LV renamed and wiped by the
        Wiper, then the metadata LV), then the mark: a crash in between
        leaves the mark, and the next start finishes.  Under the build
        lock.  (Recovery alone decides, from LVM's own listing, that a
        data LV without its metadata LV, an old copy perhaps, stays.)
        """
        with move.build_lock(volume_id):
            LOG.warning('Volume %(vol)s is deleted: removing, wiped, the '
                        'clone built here for its move from %(src)s, which '
                        'no record describes any more (the move was given '
                        'up and the volume deleted while this node was '
                        'down).', {'vol': volume_id, 'src': t.source_node})
            self.clones.tear_down(t, None)
            self.drop_node_mark(volume_id)
        self.end_part(volume_id, t)

    def _moving_here_by_mark(self, volume):
        """True if this node's mark says a move into it goes on.

        (Its mark contradicts the record, as the destination: the record
        of the move into this node was replaced by a stale save.)
        """
        part = self.contradiction(volume['id'], self.load_any(volume['id']))
        return part is not None and part.role == evidence.DESTINATION

    def _restore_before(self, volume, step):
        """Restore a record this node's mark contradicts, or refuse ``step``.

        The caller holds the volume's lock.  Only for this node's mark
        as a destination (:meth:`_moving_here_by_mark`).
        MoveContradicted, nothing done, when the record cannot be
        restored (the move was not committed, say).
        """
        if not self._moving_here_by_mark(volume):
            return
        current = self.load_any(volume['id'])
        if self.restore_contradicted(volume, current) is None:
            self.refuse_if_contradicted(volume['id'],
                                        self.load_any(volume['id']), step)

    # -- a record that a stale save replaced -------------------------------

    def restore_record(self, volume, stale):
        """Write back the record of the move this node's mark names.

        ``stale`` is the volume's record as read now (None: none), which
        this node's own mark contradicts (Side.contradiction): a stale
        whole save of the admin metadata replaced the record of the move
        into this node by an earlier move's (R18-2), or by none.  Only
        when this node is that move's destination, the move was
        committed (the volume record names this node as its destination:
        Side.names_destination, which no save of admin metadata and no
        volume owner writes), the volume's LV is still the move's, and
        no prepare of the volume runs here.  Written by a compare-and-set
        on ``stale`` (Store.restore), as a committed move set back to
        ``preparing``: what it was then is for :meth:`roll_forward` to
        tell from the clone here, as for any set-back record (R14-4).
        The caller holds the volume's lock, or runs at start.  Returns
        the move written back, or None (logged once per pair of moves).
        """
        part = self.contradiction(volume['id'], stale)
        if part is None or part.role != evidence.DESTINATION:
            return None
        t = part.move
        with move.build_lock(volume['id']):
            volume = objects.Volume.get_by_id(self.ctxt(), volume['id'])
            why = self._unrestorable(volume, t)
            if why is not None:
                self.report_contradiction(
                    volume['id'], stale, part,
                    'its record is not restored (%s)' % why)
                return None
            try:
                self.store.restore(self.ctxt(), stale, t, part.export)
            except move.MoveStateConflict:
                return None     # (changed since the read: look again)
        LOG.warning('Volume %(vol)s: its move record (%(stale)s) was replaced '
                    'by a stale copy of its admin metadata saved whole; this '
                    'node is the %(part)s, which the volume record names: '
                    'the record of that move is written back.',
                    {'vol': volume['id'],
                     'stale': side.describe_record(stale),
                     'part': part.describe()})
        return t

    def _unrestorable(self, volume, t):
        """Why move ``t``'s record cannot be written back now; or None."""
        if volume['id'] in self.building:
            return 'a prepare of the volume runs here'
        if not self.names_destination(volume, t):
            return ('the volume record names %s, not the destination %s: '
                    'the move was not committed'
                    % (volume['host'], t.dest_host))
        if t.lv_name != volume['name']:
            return ('the volume\'s LV is %s now, not %s'
                    % (volume['name'], t.lv_name))
        return None

    def restore_contradicted(self, volume, stale):
        """:meth:`restore_record`, then roll the move forward.

        For a caller that holds the volume's lock (a source step that
        found the record contradicted, the monitor, a delete).  Returns
        the move as rolled forward (or as written back, if it cannot be
        rolled forward: kept, reported), or None if nothing was written.
        """
        t = self.restore_record(volume, stale)
        if t is None:
            return None
        return self.roll_forward(volume, t) or t

    def restore_if_free(self, volume_id):
        """The monitor's :meth:`restore_contradicted`, never waiting.

        Under the volume's lock if it is free now (else the next tick
        looks again), with the record read under it.
        """
        with move.lock_if_free(volume_id) as locked:
            if not locked:
                return None
            try:
                volume = objects.Volume.get_by_id(self.ctxt(), volume_id)
                return self.restore_contradicted(volume,
                                                 self.load_any(volume_id))
            except exception.VolumeNotFound:
                return None     # (deleted meanwhile)

    # -- unmanage ----------------------------------------------------------

    def before_unmanage(self, volume):
        """Refuse an unmanage while the volume moves, with one exception.

        The LV here may hold only part of the data while the clone still
        reads from the source, and a move's record and steps need the
        volume (MoveInProgress, a VolumeIsBusy: Cinder puts the volume
        back to ``available``).  The exception: a move in
        ``finalizing`` whose clone is gone (swapped to linear, metadata
        removed) has a complete copy here and only waits to retire the
        source's; when the source is lost for good it would wait forever,
        so unmanage (then manage) ends it (:meth:`_forget_unretired`).
        """
        with move.lock(volume['id']):
            t = self.load_any(volume['id'])
            if t is None:
                return
            if self.is_dest(t) and t.state == move.FINALIZING \
                    and self._swapped_away(t):
                try:
                    self._retire_source(self.ctxt(), volume, t)
                except oslo_messaging.MessagingTimeout as exc:
                    # No answer: the source may be lost for good.
                    self._forget_unretired(volume, t, exc)
                except Exception:
                    # It answered but could not retire now (its handle
                    # held for a moment): a retry will; keep the move.
                    LOG.warning('%(src)s could not retire the old copy of '
                                'volume %(vol)s now; unmanage it again in '
                                'a moment.', {'src': t.source_node,
                                              'vol': volume['id']},
                                exc_info=True)
                    self.raise_moving(volume, t, _('unmanaging it'))
                return
            self.raise_moving(volume, t, _('unmanaging it'))

    def _forget_unretired(self, volume, t, why):
        try:
            self.clones.disconnect_source(t, volume['provider_auth'])
        except Exception:
            LOG.exception('Could not log out of %s; the session goes with '
                          'the next reboot.', t.source_node)
        self.end_part(volume['id'], t)
        self.store.clear(self.ctxt(), volume['id'], t)
        self.pending_finalize.discard(volume['id'])
        LOG.warning('Volume %(vol)s unmanaged although %(src)s could not '
                    'retire its old copy (%(why)s); the copy here is '
                    'complete. Left over on %(src)s, now or once it is '
                    'back, and described by nothing: the iSCSI target '
                    '%(iqn)s (its ACL admits this node), the handle and '
                    'the LV %(lv)s, not wiped. Remove the target and the '
                    'handle, then wipe and remove the LV by hand.',
                    {'vol': volume['id'], 'src': t.source_node,
                     'why': why, 'iqn': t.target_iqn, 'lv': t.lv_name})

    # -- finalization ------------------------------------------------------

    def finalize_pending(self):
        """Retry the finalizations that failed (after each monitor tick)."""
        for volume_id in sorted(self.pending_finalize):
            self.finalize(volume_id)

    def _swapped_away(self, t):
        """True if LVM lists no metadata LV of finalizing move ``t`` here.

        (Its clone was swapped to linear and its metadata LV removed.)
        A group LVM cannot list: False, logged.
        """
        try:
            return not self.clones.listed(t)[1]
        except dmc_exception.LVMUnlisted as exc:
            LOG.warning('Volume %(vol)s: %(why)s',
                        {'vol': t.volume_id, 'why': exc.msg})
            return False

    def finalize(self, volume_id):
        """Swap to linear, drop metadata and session, retire the source.

        Each step is idempotent; a failure keeps the move in
        ``finalizing`` and a later monitor tick tries again -- also when
        the lock is busy (the monitor never waits for it) or the source
        rests after a timeout.
        """
        ctxt = self.ctxt()
        try:
            with move.lock_if_free(volume_id) as locked:
                if not locked:
                    self.pending_finalize.add(volume_id)
                    return
                t = self.load(volume_id)
                if not self.is_dest(t):
                    self.pending_finalize.discard(volume_id)
                    return
                if t.state == move.SOURCE_LOST:
                    # (Its clone went fully hydrated as the operator began
                    # to abandon its source: the command ends it.)
                    self.pending_finalize.discard(volume_id)
                    return
                if self.contradiction(volume_id, t) is not None:
                    # (Never swapped on such a record's word: the
                    # monitor restores the record first.)
                    self.pending_finalize.discard(volume_id)
                    return
                volume = objects.Volume.get_by_id(ctxt, volume_id)
                if t.state == move.PREPARING:
                    t = self._roll_forward_finalizing(volume, t)
                    if t is None:
                        return
                if t.state != move.FINALIZING:
                    self.store.transition(ctxt, t, (move.HYDRATING,),
                                          move.FINALIZING)
                self.clones.swap_to_linear(
                    t, before=lambda: self._mark_swap(t))
                self.clones.remove_metadata(t)
                self.drop_node_mark(volume_id)
                if self.source_resting(t):
                    # (The swap needs no source: done, the retire waits.)
                    self.pending_finalize.add(volume_id)
                    return
                self._retire_source(ctxt, volume, t)
                LOG.info('Transfer of volume %(vol)s finished: it lives on '
                         '%(node)s alone.', {'vol': volume_id,
                                             'node': t.dest_node})
        except exception.VolumeNotFound:
            # Deleted meanwhile (its delete held the lock): nothing to do.
            self.pending_finalize.discard(volume_id)
        except dmc_exception.LVMUnlisted as exc:
            # (Its metadata LV neither seen gone nor removed: the source
            # is not retired, the move not ended.)
            self.pending_finalize.add(volume_id)
            LOG.warning('Volume %(vol)s: its move waits to be finalized '
                        'until LVM lists the volume groups here again '
                        '(%(why)s); tried again after each monitor tick.',
                        {'vol': volume_id, 'why': exc.msg})
        except Exception:
            self.pending_finalize.add(volume_id)
            LOG.exception('Finalizing the transfer of volume %s failed; '
                          'retrying at the next monitor tick.', volume_id)

    def _mark_swap(self, t):
        """The end mark of a swap about to be made (:meth:`mark_end`).

        A mark that cannot be written is logged, and the swap goes on:
        without it a move set back after the swap is only kept for an
        operator (:meth:`_swapped`), while a finalization stopped by it
        would never end.
        """
        try:
            self.mark_end(t, move.END_SWAP)
        except Exception:
            LOG.error('Volume %(vol)s: the mark of its swap to linear could '
                      'not be written here; should a stale save set its '
                      'move back before the source is retired, the move is '
                      'kept for an operator.', {'vol': t.volume_id},
                      exc_info=True)

    def _roll_forward_finalizing(self, volume, t):
        """A finalization found its move set back: roll it forward first.

        (R16-3: the stale save landed between the swap and the retire.)
        Under the volume's lock, which the caller holds.  Returns the
        move to finalize on with (``hydrating`` or ``finalizing``), or
        None: the move is no longer one to finalize (rolled forward to
        ``cloned``: dropped; kept as it is: retried at the next tick).
        """
        rolled = self.roll_forward(volume, t)
        if rolled is not None and rolled.state in (move.HYDRATING,
                                                   move.FINALIZING):
            return rolled
        if rolled is not None:
            self.pending_finalize.discard(t.volume_id)
        return None

    def _name_this_node(self, ctxt, volume, t):
        """A committed move: the volume record names this node from now on.

        The source records the commit, then points the volume record at
        this node: two writes.  When the database went away between them
        (the attach then failed, but the move stands: it hydrates here),
        the record still names the source, which refuses to retire a copy
        its record names.  Only a committed move gets here (finalizing:
        this node holds every byte), so the record follows it -- only
        from the move's source: a record naming any other node was
        changed by someone else (an operator, another service), and is
        reported, not overwritten.  Returns the volume as the record
        describes it now.
        """
        if volume_utils.extract_host(volume['host'], 'host') in \
                self.node_names:
            return volume
        if volume_utils.extract_host(volume['host'], 'backend') != \
                volume_utils.extract_host(t.source_host, 'backend'):
            LOG.error('Volume %(vol)s was moved here from %(src)s, but its '
                      'record names %(host)s, neither node of the move: it '
                      'is left as it is. The copy here is complete: check '
                      'which node the volume should live on and correct '
                      'its host by hand.',
                      {'vol': volume['id'], 'src': t.source_node,
                       'host': volume['host']})
            return volume
        source.name_destination(self.store, ctxt, volume, t)
        return objects.Volume.get_by_id(ctxt, volume['id'])

    def _retire_source(self, ctxt, volume, t):
        """The clone is gone: log out, retire the source, forget the move."""
        volume = self._name_this_node(ctxt, volume, t)
        self.clones.disconnect_source(t, volume['provider_auth'])
        self._send_to_source(ctxt, volume, t, peer.RETIRE)
        # The source's export goes from the record before the state does,
        # so a crash in between is finalized again.
        self.store.forget_source_export(ctxt, volume['id'])
        self.end_part(volume['id'], t)
        self.store.clear(ctxt, volume['id'], t)
        self.drop_end_mark(volume['id'])
        self.pending_finalize.discard(volume['id'])
