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

"""Ending a move whose source node is lost for good (an operator's act).

While a volume hydrates on its destination, every region not copied yet
lives only on the source.  When the source node is lost for good the move
can never finish: ``cinder-dmclone move abandon-source VOLUME`` (run as
root on the destination) ends it honestly, in steps that each check what
LVM, the kernel and the record show, so that running it again after a
crash anywhere finishes the job:

1. refuse, changing nothing, unless the move is this node's, ``cloned``
   or ``hydrating`` (or ``finalizing`` with its clone not loaded and its
   metadata LV still here: this node restarted before the finalization
   removed it, and only the source could build the clone again), its
   source's volume service is down and its iSCSI session does not
   answer (``force`` overrides the last two);
2. record the move as ``source_lost``: neither node's service acts on it
   any more (see :mod:`cinder_dmclone.recovery`);
3. put an ``error`` device of the clone's length in place of the source
   (``dmcgone-*``, :func:`cinder_dmclone.layout.lost_source_name`), with
   hydration off, and log out of the source;
4. find the regions never copied: dm-clone sends a read of a region not
   hydrated to its source, which now fails at once, and a read never
   hydrates, so one ``O_DIRECT`` read at the start of each region fails
   exactly for those (:func:`cinder_dmclone.privileged.probe_regions`).
   Counted against the clone's own hydrated count before the scan and
   again while the handle is suspended: a region the instance wrote in
   between makes the scan start over;
5. in the same suspend, replace the clone by a table that maps those
   regions to ``error`` and the rest to the LV
   (:func:`cinder_dmclone.dmsetup.fencing_table`): the instance keeps
   the copied data, and nothing reaches the regions about to be zeroed;
6. record the loss: the full list in a file, a summary in the volume's
   admin metadata (:meth:`cinder_dmclone.move.Store.record_loss`);
7. zero the regions never copied on the LV: a thick LV's extents may
   hold another tenant's old data, which must never be shown (none
   for a finalization: its metadata LV holds every region, unless the
   node lost power before it committed the last ones); of a thin LV in
   a pool that zeroes new blocks, only the parts its pool maps (the
   others read zeroes, and writing them would take pool space);
8. remove the clone's metadata LV: from here on the zeroing is known
   done, and the driver's guard lets a linear handle map the LV again;
9. map the whole LV linearly, remove the ``error`` device, forget the
   source's export, set the volume to ``error`` (unless no region was
   lost: the volume keeps its status and its data) and clear the move.

A delete of the volume while its source is lost (before the command, or
after a run cut short) removes this node's side, then cannot retire the
source's copy and fails, keeping the move: the command then finds the
data LV gone, finishes that teardown instead of steps 3 to 8, records
the whole volume as lost and ends the move as in step 9, so that the
next delete deletes the volume.

What the lost node still holds (its copy of the volume, not wiped, and
the iSCSI target that exported it) is named in the record and the output:
if the node ever comes back, its service leaves them alone (nothing
describes them any more) and an operator removes them by hand -- after
copying back, if wanted, the ranges this node never got.
"""

import dataclasses
import datetime
import hashlib
import hmac
import json
import os
import time

from oslo_log import log as logging

from cinder import context
from cinder import exception
from cinder.i18n import _
from cinder.volume import volume_utils

from cinder_dmclone import dmsetup
from cinder_dmclone import layout
from cinder_dmclone import map_mark
from cinder_dmclone import move
from cinder_dmclone import privileged
from cinder_dmclone import source
from cinder_dmclone import thin

LOG = logging.getLogger(__name__)

#: the volume statuses the command acts in (an attach, a detach, an
#: extend or a delete in flight must finish first); a failed extend
#: (one the command itself made fail: see Destination.extend) has none
SETTLED = ('in-use', 'available', 'error', 'error_extending')
#: the states of a move the command ends (or finishes ending)
ENDS = (move.CLONED, move.HYDRATING, move.FINALIZING)


class Refused(exception.VolumeBackendAPIException):
    """The command changed nothing: the message says why and what next."""

    message = _("Not abandoning the source of volume %(volume)s: "
                "%(reason)s")


class ScanRaced(exception.VolumeBackendAPIException):
    message = _("Volume %(volume)s took whole-region writes to regions "
                "never copied during each of %(attempts)d scans; nothing "
                "was zeroed. Stop the I/O of its instance (shut it down, "
                "or detach the volume) and run the command again.")


class ScanInconsistent(exception.VolumeBackendAPIException):
    message = _("The scan of volume %(volume)s found %(readable)d readable "
                "regions, its clone counts %(hydrated)d hydrated: a copied "
                "region could not be read (check the kernel log for I/O "
                "errors of the LV). Nothing was zeroed; run the command "
                "again once the LV reads.")


@dataclasses.dataclass
class Outcome:
    """What the command did, for its output."""

    volume_id: str
    source_node: str
    status: str
    region_bytes: int
    total_regions: int
    uncopied_regions: int
    #: byte ranges [(offset, length)] of the regions never copied
    ranges: list
    ranges_file: str
    #: what the lost node still holds: LV, target IQN, portal
    left_on_source: dict

    @property
    def uncopied_bytes(self):
        return sum(length for _offset, length in self.ranges)


def loss_file(state_dir, volume_id):
    return os.path.join(state_dir, 'lost-%s.json' % volume_id)


def move_digest(t):
    """What a loss file names move ``t`` by (pure): not its secret itself.

    A rerun reads it to tell this move's scan from an earlier abandon's
    of the same volume (the file's path is the volume's).
    """
    return hashlib.sha256(t.secret.encode()).hexdigest()


def write_json(path, data):
    """Write ``data`` to ``path`` atomically (a rename over it)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write('\n')
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


def default_set_status(ctxt, volume, status, expected):
    """Cinder's conditional update of the volume's status: True if done."""
    return bool(volume.conditional_update({'status': status},
                                          {'status': expected}))


class LostSource(object):
    """``cinder-dmclone move abandon-source`` on this node.

    ``clones`` are this node's :class:`~cinder_dmclone.clone.Clones`
    (handle names, LVs, the source's session), ``store`` the
    :class:`~cinder_dmclone.move.Store`; the other arguments replace the
    node and Cinder in tests: ``load_volume(ctxt, id)``,
    ``service_is_up(ctxt, host)``, ``session_states(iqn)``,
    ``probe(path, region_bytes, count)``, ``zero(path, ranges)``,
    ``set_status(ctxt, volume, status, expected)``, ``lock(volume_id)``.
    """

    #: scans tried while the instance keeps writing regions never copied
    ATTEMPTS = 5

    def __init__(self, node_names, store, clones, state_dir, load_volume,
                 service_is_up, session_states=privileged.iscsi_session_states,
                 probe=privileged.probe_regions, zero=privileged.zero_ranges,
                 set_status=default_set_status, lock=None, clock=time.time,
                 thin_maps=None):
        self.node_names = frozenset(node_names)
        self.store = store
        self.clones = clones
        self.dm = clones.dm
        self.state_dir = state_dir
        self.load_volume = load_volume
        self.service_is_up = service_is_up
        self.session_states = session_states
        self.probe = probe
        self.zero = zero
        self.set_status = set_status
        self.lock = lock or move.lock
        self.clock = clock
        self.thin_maps = thin_maps

    # -- the command ---------------------------------------------------------

    def run(self, volume_id, force=False):
        """End the move of ``volume_id`` over its lost source: Outcome."""
        ctxt = context.get_admin_context()
        with self.lock(volume_id):
            try:
                volume = self.load_volume(ctxt, volume_id)
            except exception.VolumeNotFound:
                raise Refused(volume=volume_id,
                              reason=_('no such volume')) from None
            t = self.store.load(ctxt, volume_id)
            self.check(ctxt, volume, t, force)
            if t.state != move.SOURCE_LOST:
                LOG.warning('Abandoning the lost source %(src)s of volume '
                            '%(vol)s at %(pct)s%% hydrated.',
                            {'src': t.source_node, 'vol': volume_id,
                             'pct': self.store.percent(ctxt, volume_id)})
                self.store.transition(ctxt, t, ENDS, move.SOURCE_LOST)
            return self._finish(ctxt, volume, t)

    def check(self, ctxt, volume, t, force):
        """Refuse (Refused) unless ending the move is right, and safe."""
        vid = volume['id']

        def refuse(reason):
            raise Refused(volume=vid, reason=reason)
        if t is None or t.state == move.ABORTED:
            refuse(_('no move of it is recorded; nothing to abandon'))
        if t.dest_node not in self.node_names:
            refuse(_('it moves to %(dst)s, not to this node (%(here)s): run '
                     'the command on %(dst)s') % {
                'dst': t.dest_node,
                'here': ', '.join(sorted(self.node_names))})
        if t.state == move.FINALIZING and not self._finalization_stuck(t):
            refuse(_('its hydration finished, every region is here; only '
                     'the retirement of the old copy waits for %s. Detach '
                     'it, then unmanage and manage it (see the operations '
                     'guide)') % t.source_node)
        if t.state == move.PREPARING:
            refuse(_('its move is still being prepared by %s; the '
                     'destination keeps nothing of a move that never got '
                     'built (recovery rolls it back)') % t.source_node)
        if volume['status'] not in SETTLED:
            refuse(_('its status is %(st)s; wait until it is one of '
                     '%(ok)s') % {'st': volume['status'],
                                  'ok': ', '.join(SETTLED)})
        here = volume_utils.extract_host(volume['host'], 'backend')
        if here not in (volume_utils.extract_host(t.source_host, 'backend'),
                        volume_utils.extract_host(t.dest_host, 'backend')):
            refuse(_('its record names %(host)s, neither node of its move '
                     'from %(src)s: check which node the volume lives on '
                     'and correct its host first') % {
                'host': volume['host'], 'src': t.source_node})
        if t.state == move.SOURCE_LOST:
            return      # started before: finish it, whatever the source
        if self.clones.has_data(t) and not self.clones.has_metadata(t):
            refuse(_('the clone\'s metadata LV %s is not on this node, so '
                     'which regions were copied cannot be told; check '
                     'the node with "cinder-dmclone status"')
                   % layout.metadata_lv_name(t.lv_name))
        self._refuse_if_hydrated(t, refuse)
        if force:
            LOG.warning('Volume %(vol)s: abandoning its source %(src)s '
                        'without checking that it is lost (--force).',
                        {'vol': vid, 'src': t.source_node})
            return
        if self.service_is_up(ctxt, t.source_host):
            refuse(_('the volume service of its source %(src)s (%(host)s) '
                     'still reports up: the source may only be slow or '
                     'cut off. Bring the path back and the copy finishes '
                     'by itself; abandon only a node that is lost for '
                     'good, once its service is reported down (or with '
                     '--force, which throws away whatever it could still '
                     'have copied)') % {'src': t.source_node,
                                        'host': t.source_host})
        answering = [s for s, state in
                     sorted(self.session_states(t.target_iqn).items())
                     if state == 'LOGGED_IN']
        if answering:
            refuse(_('its iSCSI session to the source (%(s)s, target '
                     '%(iqn)s) is logged in: the source still answers, so '
                     'the copy can finish once its service is back '
                     '(--force abandons it all the same)')
                   % {'s': ', '.join(answering), 'iqn': t.target_iqn})

    def _finalization_stuck(self, t):
        """True if move ``t``'s finalization needs its source to go on.

        Its metadata LV is here and its clone is not loaded: this node
        restarted before the finalization removed the metadata LV (a
        crash, or LVM not listing the group for a while), and the clone
        is built again from it only over the source.  Loaded, or without
        the metadata LV, the finalization ends without the source (or
        the unmanage path takes the LV, see the operations guide).
        """
        return (self.clones.has_metadata(t)
                and not self.dm.exists(self.clones.handle_name(t)))

    def _refuse_if_hydrated(self, t, refuse):
        name = self.clones.handle_name(t)
        if not self.dm.exists(name):
            return      # rebuilt over the error device, then scanned
        status = self._clone_status(name)
        if status is not None and status.fully_hydrated:
            refuse(_('its clone is fully hydrated: the move finishes by '
                     'itself at the monitor\'s next tick'))

    # -- the steps ------------------------------------------------------------

    def _finish(self, ctxt, volume, t):
        self._release_leftover_snapshots()
        # (LVM's own listing: brick's lookup takes a volume group not
        # found for no LV, and the move would end as lost whole over the
        # LV holding what was copied.  LVMUnlisted: nothing done, run the
        # command again.)
        data, meta = self.clones.listed(t)
        if not data:
            self._end_without_data(ctxt, volume, t)
        elif not meta:
            self._zero_unless_recorded(
                volume, t, self._scanned(volume, t))
        else:
            self._stand_in_for_source(volume, t)
            uncopied = self._scan(t)
            ranges = dmsetup.uncopied_ranges(uncopied, t.clone_sectors,
                                             t.region_sectors)
            path = self._record(ctxt, volume, t, ranges, len(uncopied))
            if uncopied:
                LOG.warning('Volume %(vol)s: %(n)d regions (%(b)d bytes) '
                            'were never copied from %(src)s; zeroing them. '
                            'Their list: %(path)s.',
                            {'vol': volume['id'], 'n': len(uncopied),
                             'b': sum(r[1] for r in ranges),
                             'src': t.source_node, 'path': path})
                self._zero(t, ranges)
            else:
                LOG.warning('Volume %(vol)s: every region was copied from '
                            '%(src)s before it was lost; nothing is '
                            'missing.', {'vol': volume['id'],
                                         'src': t.source_node})
            # (Before the metadata LV goes: see _zero_unless_recorded.)
            self._record_zeroed(path)
            self.clones.remove_metadata(t)
        if self.clones.has_data(t):
            self._map_linear(t)
        self.dm.remove(self._stand_in_name(t))
        self.clones.disconnect_source(t, volume['provider_auth'])
        self._drop_node_mark(volume['id'], t.dest_node)
        self._name_this_node(ctxt, volume, t)
        self.store.forget_source_export(ctxt, volume['id'])
        outcome = self._outcome(ctxt, volume, t)
        if outcome.uncopied_regions and not self.set_status(
                ctxt, volume, 'error', SETTLED):
            raise Refused(volume=volume['id'], reason=_(
                'its status changed while the command ran; its data is '
                'final already: run the command again to record the end'))
        self.store.clear(ctxt, volume['id'], t)
        LOG.warning('The move of volume %(vol)s from %(src)s is abandoned: '
                    'it is %(status)s, %(n)d regions lost (%(path)s). Left '
                    'on %(src)s: LV %(lv)s (not wiped) and iSCSI target '
                    '%(iqn)s.', {'vol': volume['id'], 'src': t.source_node,
                                 'status': outcome.status,
                                 'n': outcome.uncopied_regions,
                                 'path': outcome.ranges_file,
                                 'lv': t.lv_name, 'iqn': t.target_iqn})
        return outcome

    def _release_leftover_snapshots(self):
        """Release the metadata snapshots this node left recorded.

        A run killed between the reserve and the release of a thin
        pool's metadata snapshot (while :meth:`_zero` read the LV's map)
        leaves it held, and recorded as this node's: a held snapshot
        keeps every block it references allocated, a deleted volume's
        too.  The next map of that pool releases it, and so does the
        service's start; a run that reads no map (the LV removed by a
        delete since, the zeroing recorded done, nothing lost) would
        leave it held until then.  So every run releases them first,
        each under its pool's lock (the kernel's, so no service
        sharing the pool under another node name dumps it meanwhile:
        :func:`~cinder_dmclone.move.pool_lock`).  Never raises.
        """
        if self.thin_maps is not None:
            self.thin_maps.release_leftovers()

    def _scanned(self, volume, t):
        """Data LV here, metadata LV gone: this move's scan, as recorded.

        A run removes the metadata LV only once its scan is recorded in
        the loss file and the regions never copied are zeroed (the file
        then says ``zeroed``).  Without this move's record there (a run
        cut short before its scan, then the metadata LV lost with its
        device, or removed by hand), which regions were copied cannot
        be told: Refused, the LV neither mapped nor ended on, whatever
        an earlier abandon of the volume recorded.
        """
        try:
            with open(loss_file(self.state_dir, volume['id'])) as f:
                saved = json.load(f)
            recorded = saved.get('move') or ''
        except (OSError, ValueError, AttributeError):
            saved, recorded = {}, ''
        if not hmac.compare_digest(recorded, move_digest(t)):
            raise Refused(volume=volume['id'], reason=_(
                'the clone\'s metadata LV %s is gone and no scan of this '
                'move was recorded, so which regions of LV %s were copied '
                'cannot be told; nothing was changed (handle the LV as a '
                'clone that lost its metadata LV: see the operations '
                'guide)')
                % (layout.metadata_lv_name(t.lv_name), t.lv_name))
        return saved

    def _zero_unless_recorded(self, volume, t, saved):
        """Zero what this move's scan found uncopied, unless recorded done.

        (A run cut short while zeroing, its metadata LV lost since.)
        Safe to do again then: until the file says ``zeroed``, the
        metadata LV was not removed by a run, so no linear table was
        ever mapped over those regions (the fencing table or no handle
        at all): nothing has written to them.  Once it says so, never
        again: a linear table may have been mapped since, and the
        instance may have written there.
        """
        if saved.get('zeroed'):
            return
        ranges = [tuple(r) for r in saved.get('ranges') or ()]
        LOG.warning('Volume %(vol)s: zeroing again the %(n)d ranges its '
                    'scan found never copied (a run was cut short while '
                    'zeroing them).', {'vol': volume['id'], 'n': len(ranges)})
        if ranges:
            self._zero(t, ranges)
        self._record_zeroed(loss_file(self.state_dir, volume['id']))

    def _zero(self, t, ranges):
        """Zero the byte ``ranges`` of the move's LV that were never copied.

        A thick LV's extents, and a thin LV's mapped blocks, may hold
        another tenant's old data (or this node's copy never committed):
        zeroes are written there.  A block a thin LV does not map reads
        zeroes already, and writing zeroes would map it: for a volume
        abandoned early, nearly its whole size taken from the pool at
        once, which can fill an over-committed pool and stop every thin
        LV of this node.  So, of a thin LV in a pool that zeroes new
        blocks, only the parts in mapped blocks are written; the map is
        read now, once the fencing table (or no handle at all) keeps any
        write from these ranges (``thin_maps``:
        :meth:`~cinder_dmclone.region_map.ThinMaps.zeroing_map`).
        """
        device_map = None
        if self.thin_maps is not None:
            device_map = self.thin_maps.zeroing_map(t.lv_name)
        if device_map is not None:
            parts = thin.mapped_parts(ranges, device_map)
            LOG.info('Volume %(vol)s: thin LV %(lv)s maps %(n)d of the '
                     'ranges never copied (%(b)d bytes); zeroing only '
                     'those, the rest reads zeroes unmapped.',
                     {'vol': t.volume_id, 'lv': t.lv_name, 'n': len(parts),
                      'b': sum(length for _o, length in parts)})
            ranges = parts
        if ranges:
            self.zero(self.clones.lv_path(t), ranges)

    @staticmethod
    def _record_zeroed(path):
        """The loss file at ``path`` says its ranges are zeroed (atomic)."""
        with open(path) as f:
            saved = json.load(f)
        saved['zeroed'] = True
        write_json(path, saved)

    def _name_this_node(self, ctxt, volume, t):
        """The volume record names this node, which holds the volume now.

        The source records the commit, then points the record at the
        destination: two writes, and the finalization repoints it if the
        second was lost.  A move abandoned before that finalization
        would leave the record naming the lost node, whose stale copy
        its service would serve again if it ever came back.  (A record
        naming neither node is refused by :meth:`check`.)
        """
        if volume_utils.extract_host(volume['host'], 'host') in \
                self.node_names:
            return
        source.name_destination(self.store, ctxt, volume, t)

    def _end_without_data(self, ctxt, volume, t):
        """This node's side is gone already: finish its teardown.

        A delete of the volume removes the handle, the session, the data
        LV and then the metadata LV here, then asks the source to retire
        its copy: with the source lost that fails, the move stays
        recorded and every retry of the delete fails the same way.
        Nothing of the volume is left here to scan or zero: what a cut
        short teardown left goes, and the whole volume is recorded as
        lost, with what the lost node still holds.
        """
        self.dm.remove(self.clones.handle_name(t))
        self.clones.remove_metadata(t)
        count = dmsetup.region_count(t.clone_sectors, t.region_sectors)
        ranges = dmsetup.uncopied_ranges(range(count), t.clone_sectors,
                                         t.region_sectors)
        path = self._record(ctxt, volume, t, ranges, count)
        LOG.warning('Volume %(vol)s: its LV %(lv)s is no longer on this '
                    'node (a delete removed it), nothing of it is left '
                    'here; recorded as lost whole (%(path)s).',
                    {'vol': volume['id'], 'lv': t.lv_name, 'path': path})

    def _drop_node_mark(self, volume_id, node):
        """The clone is gone: this node's marks of it go.

        Its thin-mapped mark, and its mark of the move it took part in
        (:mod:`~cinder_dmclone.evidence`): the move ends here.

        (Under the service's state directory, which this command shares:
        see :mod:`~cinder_dmclone.map_mark`.)  A failure is only logged:
        a mark left is inert for any later move of the volume.
        """
        for subdir in (map_mark.SUBDIR, map_mark.MOVING):
            marks = map_mark.MapMarks(map_mark.marks_dir(self.state_dir,
                                                         node, subdir))
            try:
                marks.remove(volume_id)
            except Exception:
                LOG.warning('Volume %(vol)s: its mark (%(dir)s) could not '
                            'be removed; it is inert.',
                            {'vol': volume_id, 'dir': marks.directory},
                            exc_info=True)

    def _stand_in_name(self, t):
        return layout.lost_source_name(self.clones.vg.vg_name, t.lv_name)

    def _stand_in_for_source(self, volume, t):
        """The clone over an ``error`` device; the source logged out.

        Built again from the metadata LV whatever the handle holds now
        (the clone over the source, over the error device, or the
        fencing table a crash left live): the metadata was committed
        when the handle was last suspended, and nothing has written
        through a clone since.
        """
        gone = self._stand_in_name(t)
        if not self.dm.exists(gone):
            self.dm.create(gone, [dmsetup.error_segment(0, t.clone_sectors)],
                           uuid=layout.HANDLE_UUID_PREFIX + gone)
        table = self.clones.clone_table(t, dmsetup.device_path(gone),
                                        hydrate=False)
        name = self.clones.handle_name(t)
        if self.dm.exists(name):
            self.dm.swap(name, table)
        else:
            self.dm.create(name, table, uuid=layout.handle_uuid(
                self.clones.vg.vg_name, t.lv_name))
        self.clones.disconnect_source(t, volume['provider_auth'])

    def _clone_status(self, name):
        status = [line.clone for line in self.dm.status(name) if line.clone]
        if not status:
            return None
        if status[0].failed:
            raise exception.VolumeBackendAPIException(
                data=_('the clone %(name)s reports %(state)s: its metadata '
                       'cannot be trusted; nothing was zeroed')
                % {'name': name, 'state': status[0].state})
        return status[0]

    def _scan(self, t):
        """The regions never copied, fenced off (see the module doc)."""
        name = self.clones.handle_name(t)
        count = dmsetup.region_count(t.clone_sectors, t.region_sectors)
        region_bytes = t.region_sectors * dmsetup.SECTOR_SIZE
        total = self.dm.device_sectors(self.clones.lv_path(t))
        for _attempt in range(self.ATTEMPTS):
            before = self._clone_status(name).hydrated_regions
            uncopied = self.probe(dmsetup.device_path(name), region_bytes,
                                  count)
            seen = {}

            def unchanged():
                seen['after'] = self._clone_status(name).hydrated_regions
                return (seen['after'] == before
                        and count - len(uncopied) == before)
            table = dmsetup.fencing_table(uncopied, t.clone_sectors,
                                          t.region_sectors,
                                          self.clones.lv_path(t), total)
            if self.dm.swap(name, table, check=unchanged):
                return uncopied
            if seen['after'] == before:
                raise ScanInconsistent(volume=t.volume_id,
                                       readable=count - len(uncopied),
                                       hydrated=before)
            LOG.info('Volume %(vol)s took writes during the scan '
                     '(%(a)d hydrated regions, then %(b)d); scanning again.',
                     {'vol': t.volume_id, 'a': before, 'b': seen['after']})
        raise ScanRaced(volume=t.volume_id, attempts=self.ATTEMPTS)

    def _record(self, ctxt, volume, t, ranges, regions):
        """The loss, in a file (all of it) and in the volume's record."""
        path = loss_file(self.state_dir, volume['id'])
        previous = self.store.loss_of(
            self.store.db.volume_admin_metadata_get(ctxt, volume['id']))
        lost_at = previous.get('lost_at') if previous.get(
            'lost_source') == t.source_node else None
        lost_at = lost_at or datetime.datetime.fromtimestamp(
            self.clock(), datetime.timezone.utc).strftime(
                '%Y-%m-%dT%H:%M:%SZ')
        left = self._left_on_source(t)
        write_json(path, {
            'volume_id': volume['id'], 'move': move_digest(t),
            'source_node': t.source_node,
            'source_host': t.source_host, 'lost_at': lost_at,
            'region_bytes': t.region_sectors * dmsetup.SECTOR_SIZE,
            'total_regions': dmsetup.region_count(t.clone_sectors,
                                                  t.region_sectors),
            'uncopied_regions': regions,
            'uncopied_bytes': sum(r[1] for r in ranges),
            'ranges': [list(r) for r in ranges],
            'left_on_source': left})
        self.store.record_loss(ctxt, volume['id'], {
            'lost_source': t.source_node, 'lost_at': lost_at,
            'lost_regions': str(regions),
            'lost_bytes': str(sum(r[1] for r in ranges)),
            'lost_ranges': dmsetup.ranges_text(ranges, move.VALUE_LIMIT),
            'lost_ranges_file': path,
            'lost_source_lv': t.lv_name,
            'lost_source_target': '%s %s' % (t.target_portal,
                                             t.target_iqn)})
        return path

    @staticmethod
    def _left_on_source(t):
        return {'node': t.source_node, 'host': t.source_host,
                'lv': t.lv_name, 'target_iqn': t.target_iqn,
                'target_portal': t.target_portal}

    def _map_linear(self, t):
        """The whole LV, linearly: only once its metadata LV is gone."""
        name = self.clones.handle_name(t)
        lv = self.clones.lv_path(t)
        table = [dmsetup.linear_segment(0, self.dm.device_sectors(lv), lv)]
        if not self.dm.exists(name):
            self.dm.create(name, table, uuid=layout.handle_uuid(
                self.clones.vg.vg_name, t.lv_name))
            return
        current = self.dm.table(name)
        if (any(s.target != 'linear' for s in current)
                or dmsetup.table_length(current) != table[0].length):
            self.dm.reload(name, table)

    def _outcome(self, ctxt, volume, t):
        """The Outcome, from the file the scan wrote (also after a crash).

        Its status is ``error`` if any region was lost, else the
        volume's own (which the command leaves as it is).
        """
        loss = self.store.loss_of(
            self.store.db.volume_admin_metadata_get(ctxt, volume['id']))
        path = loss.get('lost_ranges_file') or loss_file(self.state_dir,
                                                         volume['id'])
        try:
            with open(path) as f:
                saved = json.load(f)
        except (OSError, ValueError):
            # (Removed by hand after a crash: the record's summary, whose
            # ranges may be cut short, is all there is.)
            LOG.warning('Cannot read %s; showing the ranges the volume\'s '
                        'record keeps.', path, exc_info=True)
            saved = self._saved_from_record(t, loss)
        return Outcome(
            volume_id=volume['id'], source_node=t.source_node,
            status='error' if saved['uncopied_regions'] else
            volume['status'], region_bytes=saved['region_bytes'],
            total_regions=saved['total_regions'],
            uncopied_regions=saved['uncopied_regions'],
            ranges=[tuple(r) for r in saved['ranges']], ranges_file=path,
            left_on_source=saved['left_on_source'])

    def _saved_from_record(self, t, loss):
        ranges = []
        for token in (loss.get('lost_ranges') or '').split(','):
            offset, sep, length = token.partition('+')
            try:
                ranges.append((dmsetup.parse_size_token(offset),
                               dmsetup.parse_size_token(length)))
            except ValueError:
                continue    # the '...+N more' marker
        return {'region_bytes': t.region_sectors * dmsetup.SECTOR_SIZE,
                'total_regions': dmsetup.region_count(t.clone_sectors,
                                                      t.region_sectors),
                'uncopied_regions': int(loss.get('lost_regions') or 0),
                'ranges': ranges,
                'left_on_source': self._left_on_source(t)}
