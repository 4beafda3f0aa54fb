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

"""This node's own, durable marks of clones moved into it.

The destination of a move marks its clone thin mapped before the first
discard of a thin map, so that every later start of its service guards
the clone's hydration (Destination.guard_pool_zeroing).  The mark in the
move's record is not enough: Cinder's ``Volume.save`` writes a volume's
admin metadata whole, from a copy that may predate the mark, and so
deletes it.  A file per volume under the service's state directory
(``<state_path>/dmclone/thin-mapped/<node>/<volume id>``), holding the move's
tag (:func:`cinder_dmclone.move.thin_map_tag`), is written beside it:
nothing but this node's service touches it.

A mark names one move: a file holding another move's tag is inert.

The same files, in another directory (:data:`ENDING`), tell how a move
into this node was ending here: a finalization about to swap its fully
hydrated clone to linear, or a rollback about to tear its clone down
(Destination.mark_end).  A stale save of the record cannot remove
them, and no volume owner reaches them: they are what tells such an
end from a transient miss of LVM or from an operator's abandon of the
move's source, once the record is set back (Destination._emptied,
Destination._swapped).

The same files again, in a third directory (:data:`MOVING`), say which
move of a volume this node takes part in, as its source or its
destination (:mod:`cinder_dmclone.evidence`): a stale save of the record
that names another move is then told from the move in progress here.

No Cinder object and no move state here: path logic (pure) and the
file's durable write, read and removal.
"""

import errno
import hmac
import os
import re

#: the directory under the service's state directory (``<state_path>/
#: dmclone``) holding the marks.
SUBDIR = 'thin-mapped'
#: the one holding the marks of a move's end begun here.
ENDING = 'ending'
#: the one holding the marks of the move this node takes part in.
MOVING = 'moving'
#: what a volume id may look like to name a file (a UUID in Cinder): no
#: ``/``, no ``.`` (``.``, ``..`` and the temporary files never collide).
_VOLUME_ID_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$')
#: a tag is 32 hex digits; a file is never read beyond this.
_READ_LIMIT = 256
_TMP_SUFFIX = '.tmp'


class MarkNameInvalid(ValueError):
    """A volume id (or node name) that cannot name a mark's file."""


def marks_dir(state_dir, node, subdir=SUBDIR):
    """The directory of ``node``'s marks under the service's ``state_dir``.

    ``subdir``: :data:`SUBDIR` (thin mapped), :data:`ENDING` or
    :data:`MOVING`.

    Named after the node, as region_map's records of held snapshots
    are: two volume services of one host may share a state directory
    under two node names, and one's teardown must never remove a mark
    the other wrote (R15-2).  Raises MarkNameInvalid for a node name
    that is not a plain file name.
    """
    if not isinstance(node, str) or not node or '/' in node \
            or node in ('.', '..') or '\0' in node:
        raise MarkNameInvalid('%r cannot name a directory of thin-mapped '
                              'marks' % (node,))
    return os.path.join(state_dir, subdir, node)


def mark_path(directory, volume_id):
    """The file of ``volume_id``'s mark in ``directory`` (pure).

    Raises MarkNameInvalid for an id that is not a plain file name.
    """
    if not isinstance(volume_id, str) or \
            not _VOLUME_ID_RE.match(volume_id):
        raise MarkNameInvalid('%r cannot name a thin-mapped mark'
                              % (volume_id,))
    return os.path.join(directory, volume_id)


def same_tag(value, tag):
    """True if the mark's ``value`` is ``tag`` (constant-time compare)."""
    return (isinstance(value, str) and bool(tag)
            and hmac.compare_digest(value.encode('utf-8'),
                                    tag.encode('utf-8')))


class MapMarks(object):
    """The marks of one node, in ``directory`` (see :func:`marks_dir`).

    Each write is durable before it returns: the tag goes to a temporary
    file, which is flushed to disk and renamed over the mark, and the
    directory is flushed too.  A crash leaves the old mark or the new
    one, never a partial file that reads as neither.  ``read_limit``:
    the most a read takes of a mark (a tag's 32 digits by default; the
    marks of :data:`MOVING` hold a move's record).
    """

    def __init__(self, directory, read_limit=_READ_LIMIT):
        self.directory = directory
        self.read_limit = read_limit

    def path(self, volume_id):
        return mark_path(self.directory, volume_id)

    def write(self, volume_id, tag):
        """Mark ``volume_id``'s clone thin mapped by the move of ``tag``.

        Raises OSError (or MarkNameInvalid) if the mark is not on disk.
        """
        path = self.path(volume_id)
        self._ensure_dir()
        tmp = path + _TMP_SUFFIX
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, tag.encode('ascii'))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _fsync_dir(self.directory)

    def read(self, volume_id):
        """The tag marked for ``volume_id``; None if there is no mark.

        Raises OSError if a mark is there but cannot be read.
        """
        try:
            with open(self.path(volume_id), 'rb') as f:
                data = f.read(self.read_limit)
        except FileNotFoundError:
            return None
        return data.decode('ascii', 'replace').strip()

    def volume_ids(self):
        """The ids of the volumes marked here, sorted.

        Only the names a mark may have (:func:`mark_path`): never a
        temporary file of a write cut short.  None marked if the
        directory is not there yet.  Raises OSError if it cannot be
        listed.
        """
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if _VOLUME_ID_RE.match(n))

    def remove(self, volume_id):
        """Remove ``volume_id``'s mark; True if there was one.

        Raises OSError if it cannot be removed.
        """
        try:
            os.unlink(self.path(volume_id))
        except FileNotFoundError:
            return False
        _fsync_dir(self.directory)
        return True

    def _ensure_dir(self):
        """Create the marks' directory, durably, if it is not there.

        Each directory made is flushed into its parent, up to the first
        that was there: a mark must not vanish with a directory entry
        that never reached the disk.
        """
        missing = []
        path = os.path.abspath(self.directory)
        while not os.path.isdir(path):
            missing.append(path)
            path = os.path.dirname(path)
        for path in reversed(missing):
            try:
                os.mkdir(path, 0o700)
            except OSError as exc:
                if exc.errno != errno.EEXIST:
                    raise
            _fsync_dir(os.path.dirname(path))


def _fsync_dir(directory):
    """Flush ``directory``'s entries (a rename, a new file) to disk."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
