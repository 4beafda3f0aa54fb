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

"""This node's own evidence of the move it takes part in, per volume.

A move's record lives in the volume's admin metadata, which Cinder saves
whole from an older read (R14-4): a copy read during one move and saved
during a later one replaces the later move's record by the earlier
one's (another secret, other roles for the two nodes) while each node
still holds what the later move built.  Acted on, that record would have
the later move's source torn down as a half-built clone, and its
destination give up a "stale prepare" and serve its unfinished clone.

So each node marks, before its part in a move begins, which move it
takes part in and as what (:data:`SOURCE` or :data:`DESTINATION`): the
move's record as it was then, secret included, in a file of its own
(``<state_path>/dmclone/moving/<node>/<volume id>``, written durably by
:class:`~cinder_dmclone.map_mark.MapMarks`) that no save of the admin
metadata and no volume owner reaches.  The destination writes it at the
prepare, before it builds anything; the source once it recorded the
move, before it asks the destination to build.  Each removes it when its
part ends, before the record is cleared: a crash in between leaves a
record without a mark, which is handled as before this mark existed (no
mark is no evidence).

A mark *contradicts* a record when it names another move (another
secret, or the record names none) while what it names is still here
(:meth:`Evidence.live`), unless the record is of a later move of this
node's as source (:func:`superseded`).  A mark whose move left nothing
here is an old one: it is overwritten by the next part this node takes,
and never stands for any other move.
"""

import dataclasses
import hmac
import json

from oslo_log import log as logging

from cinder import context
from cinder import exception
from cinder import objects

from cinder_dmclone import exception as dmc_exception
from cinder_dmclone import layout
from cinder_dmclone import move

LOG = logging.getLogger(__name__)

SOURCE = 'source'
DESTINATION = 'destination'
ROLES = (SOURCE, DESTINATION)
#: the most a mark may hold (a record is well under 2 KiB).
READ_LIMIT = 8192


class PartMarkInvalid(ValueError):
    """A mark that does not describe a move this node takes part in."""


@dataclasses.dataclass(frozen=True)
class Part:
    """What a mark says: this node is ``role`` of ``move``.

    ``export``: the ACL the move's export gave, as the source recorded it
    with the move (:data:`~cinder_dmclone.move.EXPORT_KEY`), or None.
    """

    role: str
    move: move.Move
    export: str = None

    def describe(self):
        """The move, for a log line an operator reads."""
        t = self.move
        return ('%s of the move from %s to %s recorded at %s'
                % (self.role, t.source_node, t.dest_node, t.prepared_at))


def encode(role, t, export=None):
    """The text of a mark saying this node is ``role`` of move ``t`` (pure).

    Raises PartMarkInvalid for a move without a secret: nothing could tell
    it from another move.
    """
    if role not in ROLES:
        raise PartMarkInvalid('no role %r' % (role,))
    if not t.secret:
        raise PartMarkInvalid('the move of volume %s has no secret'
                              % t.volume_id)
    return json.dumps({'role': role, 'record': t.to_metadata(),
                       'export': export}, sort_keys=True)


def decode(volume_id, text):
    """The Part a mark's ``text`` describes (pure); PartMarkInvalid if none.

    The record is validated as a record read from the database is
    (Move.from_metadata).
    """
    try:
        data = json.loads(text)
        role, record = data['role'], data['record']
        export = data.get('export')
        t = move.Move.from_metadata(volume_id, record)
    except (ValueError, TypeError, KeyError, AttributeError,
            move.MoveStateInvalid) as exc:
        raise PartMarkInvalid(str(exc)) from None
    if role not in ROLES or t is None or not t.secret or \
            (export is not None and not isinstance(export, str)):
        raise PartMarkInvalid('not a move this node takes part in')
    return Part(role, t, export)


def same_secret(a, b):
    """True if moves ``a`` and ``b`` (either may be None) share a secret."""
    return (a is not None and b is not None and bool(a.secret)
            and hmac.compare_digest(a.secret.encode(), b.secret.encode()))


def superseded(part, t):
    """True if record ``t`` is of a later move than ``part``'s (pure).

    Only where both moves were prepared by this node as their source
    (``part`` a :data:`SOURCE` mark, ``t`` naming this node as source,
    which the caller checks): both ``prepared_at`` then come from this
    node's own clock.  A stale save restores an *earlier* record than
    the mark's move, never a later one; a later record over an older
    source mark is the next move of the volume from here, which a crash
    caught between its record and its mark (:meth:`Source.move
    <cinder_dmclone.source.Source.move>`), after a rollback whose
    release never reached this node, left without a mark of its own.
    Equal times (the same second) are not told apart: contradicted.
    """
    return (t is not None and part.role == SOURCE
            and t.prepared_at is not None
            and part.move.prepared_at is not None
            and t.prepared_at > part.move.prepared_at)


class Evidence(object):
    """The marks of the moves this node takes part in.

    ``marks`` is a :class:`~cinder_dmclone.map_mark.MapMarks` of the
    :data:`~cinder_dmclone.map_mark.MOVING` directory (read with
    :data:`READ_LIMIT`); ``clones`` this node's
    :class:`~cinder_dmclone.clone.Clones` (what is here);
    ``node_names`` every name of this node.
    """

    def __init__(self, marks, clones, node_names):
        self.marks = marks
        self.clones = clones
        self.node_names = frozenset(node_names)

    def record(self, t, role, export=None):
        """Mark, durably, that this node is ``role`` of move ``t``.

        Replaces the volume's previous mark here (a node takes part in
        one move of a volume at a time).  Raises PartNotRecorded if the
        mark is not on disk.
        """
        try:
            self.marks.write(t.volume_id, encode(role, t, export))
        except Exception as exc:
            raise dmc_exception.PartNotRecorded(
                volume=t.volume_id, reason=exc) from exc

    def read(self, volume_id):
        """The Part this node's mark of ``volume_id`` says; None if none.

        A mark that cannot be read, or that names no move this node
        takes part in, is no evidence: logged, None.
        """
        try:
            text = self.marks.read(volume_id)
            if text is None:
                return None
            part = decode(volume_id, text)
        except Exception as exc:
            LOG.warning('Volume %(vol)s: the mark of the move this node '
                        'takes part in (%(dir)s) is unusable (%(why)s); '
                        'it is no evidence.',
                        {'vol': volume_id, 'dir': self.marks.directory,
                         'why': exc})
            return None
        names = part.move.dest_node if part.role == DESTINATION \
            else part.move.source_node
        return part if names in self.node_names else None

    def volume_ids(self):
        """The ids of the volumes this node holds a mark of.

        For a start that looks for the moves this node takes part in
        whose record a stale save removed (no record names this node
        then).  A directory that cannot be listed is no evidence:
        logged, none.
        """
        try:
            return self.marks.volume_ids()
        except OSError:
            LOG.warning('The marks of the moves this node takes part in '
                        '(%s) cannot be listed; they are no evidence.',
                        self.marks.directory, exc_info=True)
            return []

    def forget(self, volume_id, t):
        """This node's part in move ``t`` is over: its mark goes.

        Only a mark of ``t`` itself (or an unusable one): never the mark
        of a later move, however late this runs.  A failure is only
        logged: an old mark is inert once its move left nothing here.
        """
        try:
            text = self.marks.read(volume_id)
            if text is not None:
                try:
                    if not same_secret(t, decode(volume_id, text).move):
                        return
                except PartMarkInvalid:
                    pass
                self.marks.remove(volume_id)
        except Exception:
            LOG.warning('Volume %(vol)s: the mark of the move this node '
                        'took part in (%(dir)s) could not be removed; it '
                        'is inert once nothing of that move is here.',
                        {'vol': volume_id, 'dir': self.marks.directory},
                        exc_info=True)

    def drop(self, volume_id):
        """Remove this node's mark of ``volume_id``, whatever move it names.

        For a delete of the volume only (no move of it survives that).
        A failure is only logged: the mark of a deleted volume is inert.
        """
        try:
            self.marks.remove(volume_id)
        except Exception:
            LOG.warning('Volume %(vol)s: the mark of the move this node '
                        'took part in (%(dir)s) could not be removed; the '
                        'volume is deleted, so it is inert.',
                        {'vol': volume_id, 'dir': self.marks.directory},
                        exc_info=True)

    def contradiction(self, volume_id, t):
        """The Part this node's evidence holds against record ``t``; or None.

        ``t`` is the volume's move as recorded now (None: none).  None
        when this node has no usable mark of the volume, or its mark
        names ``t`` itself (whatever its state), or ``t`` is a later move
        from this node (:func:`superseded`), or what it names left
        nothing here (:meth:`live`).
        """
        part = self.read(volume_id)
        if part is None or same_secret(t, part.move):
            return None
        if t is not None and t.source_node in self.node_names \
                and superseded(part, t):
            return None
        return part if self.live(part) else None

    @staticmethod
    def _volume(t):
        """The volume of move ``t`` as recorded now; None if deleted."""
        try:
            return objects.Volume.get_by_id(context.get_admin_context(),
                                            t.volume_id)
        except exception.VolumeNotFound:
            return None

    def live(self, part):
        """True if ``part``'s move still goes on here, by what is here.

        The source's: its data LV (the copy the destination reads),
        unless the volume's record names it an old copy of this node's
        (:meth:`_old_copy_here`: the move was abandoned as lost).  The
        destination's: its metadata LV, or its clone loaded; or its data
        LV while the volume record still names the move's export on its
        source (:meth:`_reads_source`: a clone that lost its metadata LV,
        or one swapped to linear whose source is not retired yet).  Not
        a move that finished here: its metadata LV went, its handle is
        linear, and the record stopped naming the source's export before
        the move was cleared.  LVM's own listing (Clones.listed): a
        volume group it cannot list keeps the evidence (nothing is taken
        as absent).
        """
        t = part.move
        try:
            data, meta = self.clones.listed(t)
        except dmc_exception.LVMUnlisted:
            return True
        if part.role == SOURCE:
            return data and not self._old_copy_here(t)
        if meta or (self.clones.loaded(t) and not self.clones.swapped(t)):
            return True
        return data and self._reads_source(t)

    def _old_copy_here(self, t):
        """True if the volume's record names ``t``'s LV here an old copy.

        (Written when a move away from this node was abandoned as lost,
        or a rollback kept a clone's LV: Store.old_copies_of.)  No such
        copy is read by any move.
        """
        volume = self._volume(t)
        if volume is None:
            return True
        copies = move.Store.old_copies_of(volume.admin_metadata)
        return any(copies.get(name) == t.lv_name for name in self.node_names)

    def _reads_source(self, t):
        """True if the volume record names move ``t``'s source export.

        (Its ``provider_location``: Cinder's column, which no save of
        the admin metadata writes.)
        """
        volume = self._volume(t)
        if volume is None:
            return False
        location = volume['provider_location']
        return (layout.export_portal(location) == t.target_portal
                and layout.export_iqn(location) == t.target_iqn)
