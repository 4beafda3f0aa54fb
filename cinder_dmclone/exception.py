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

"""Error types of cinder-dmclone.

Every error derives from a Cinder exception so the volume manager handles it
the way it handles any driver failure (volume status, user messages), while
callers inside the driver can still tell them apart.
"""

from cinder import exception
from cinder.i18n import _


class PrivilegedCommandFailed(exception.VolumeBackendAPIException):
    """A command run as root (:mod:`cinder_dmclone.privileged`) failed.

    The subclasses below are failures recognised by the command's exit
    status and one exact line of its output; anything else is this class.
    """

    message = _("%(command)s failed: %(reason)s")

    @property
    def exit_code(self):
        """The command's exit status; None if it could not be started."""
        return self.kwargs.get('exit_code')


class CommandRefused(PrivilegedCommandFailed):
    """cinder-rootwrap admits no such command line (its exit status 99).

    The filter file of this release (``dmclone.filters``) is missing from
    rootwrap's ``filters_path``, or an older one is installed.
    """


class DMSetupCommandFailed(PrivilegedCommandFailed):
    """A dmsetup (or blockdev) command failed."""


class DMDeviceNotFound(DMSetupCommandFailed):
    """dmsetup found no device-mapper device of the given name."""


class DMSetupCommandRefused(DMSetupCommandFailed, CommandRefused):
    """cinder-rootwrap refused a dmsetup or blockdev command line."""


class DeviceNotFound(PrivilegedCommandFailed):
    """The device a command was to write has no node under /dev."""


class KernelModuleNotFound(PrivilegedCommandFailed):
    """The running kernel's module directory has no such module."""


class KernelModuleRefused(PrivilegedCommandFailed):
    """modprobe found the module, the kernel refused to load it.

    The kernel's log (dmesg) says why: module loading disabled, a
    signature it does not accept, a module built for another kernel.
    """


class DMStatusParseError(exception.VolumeBackendAPIException):
    """The kernel reported a status or table line we cannot interpret."""

    message = _("Cannot parse device-mapper output %(line)r: %(reason)s")


class LVSParseError(exception.VolumeBackendAPIException):
    """LVM reported a line of ``lvs`` we cannot interpret."""

    message = _("Cannot parse lvs output %(line)r: %(reason)s")


class ThinDumpParseError(exception.VolumeBackendAPIException):
    """thin_dump's view of a thin device we cannot interpret."""

    message = _("Cannot read thin device %(dev_id)s from thin_dump: "
                "%(reason)s")


class ThinDumpTooLarge(ThinDumpParseError):
    """thin_dump's output is larger than a map may cost.

    A tenant decides how fragmented its thin LV is: past the bound the
    dump is not read further, and the move copies every region.
    """


class ThinTableInvalid(exception.VolumeBackendAPIException):
    """A thin pool's or thin LV's table is not what a thin map relies on."""

    message = _("Table of %(name)s: %(reason)s")


class RegionMapInvalid(exception.InvalidInput):
    """A serialised region map that does not decode to a clone's regions."""

    message = _("Invalid region map %(value)r: %(reason)s")


class ThinMapNotRecorded(exception.VolumeBackendAPIException):
    """The mark that a clone is thin mapped could not be recorded.

    The mark must be in the move's record and on the destination's node
    before the first discard (see
    :meth:`cinder_dmclone.move.Store.mark_thin_mapped` and
    :mod:`cinder_dmclone.map_mark`), and the move's
    space was counted with its map, so it cannot fall back to copying
    every region either: it is given up, with nothing discarded.
    """

    message = _("The move of volume %(volume)s was given up before its "
                "thin map was applied: the mark that its clone's regions "
                "are taken as copied could not be recorded (%(reason)s). "
                "Nothing was discarded; the move may be tried again.")


class MetadataSnapBusy(PrivilegedCommandFailed):
    """A thin pool already holds a metadata snapshot (only one at a time).

    Someone (another dump of ours that did not finish, or another tool)
    reserved it; the kernel refuses another until it is released.
    """


class MetadataSnapReleased(exception.VolumeBackendAPIException):
    """A thin pool's metadata snapshot was released under a map's dump.

    The kernel keeps one snapshot per pool and knows no owner: another
    release (a leftover's, by a service sharing the pool) freed it while
    ``thin_dump`` read it, so what was read may not be a map.
    """

    message = _("The metadata snapshot of thin pool %(vg)s/%(pool)s was "
                "released while its map was read: the map is not used.")


class PoolLockTimeout(exception.VolumeBackendAPIException):
    """A thin pool's lock stayed held past a reader's wait.

    Something holds it for good (a dump stuck on a failing disk, a
    coordination backend that never took the release): the reader does
    without the map rather than wait past every deadline.
    """

    message = _("The lock of thin pool %(vg)s/%(pool)s stayed held for "
                "%(seconds)s seconds: its map is not read now.")


class PoolLockLost(exception.VolumeBackendAPIException):
    """A thin pool's lock was no longer ours when released.

    Its lease ran out while held (a starved heartbeat, a coordination
    backend out of reach longer than its lock timeout): another reader
    may have released the pool's snapshot and taken its own meanwhile,
    so nothing read under the lock is used.
    """

    message = _("The lock of thin pool %(vg)s/%(pool)s was lost while "
                "held: what was read under it is not used.")


class MetadataSnapNotHeld(PrivilegedCommandFailed):
    """A release of a thin pool's metadata snapshot found none held."""


class InvalidDMName(exception.InvalidInput):
    """A name or path refused before it could reach a command line."""

    message = _("Refusing device-mapper argument %(value)r: %(reason)s")


class InvalidTable(exception.InvalidInput):
    """A device-mapper table that the kernel would reject."""

    message = _("Invalid device-mapper table: %(reason)s")


class DestinationFull(exception.VolumeBackendAPIException):
    """The node a volume should move to cannot hold it."""

    message = _("Node %(node)s cannot take volume %(volume)s: volume group "
                "%(vg)s has %(free).2f GiB free, %(need).2f GiB needed. "
                "Free space there or attach the volume on its node.")


class ThinPoolFull(DestinationFull):
    """The thin pool of the node a volume should move to cannot hold it.

    ``kind`` says which bound (see :func:`cinder_dmclone.thin.shortfall`),
    ``free`` and ``need`` are in GiB, ``reason`` says what they count.
    """

    message = _("Node %(node)s cannot take volume %(volume)s: thin pool "
                "%(pool)s %(reason)s. Free space there or attach the "
                "volume on its node.")


class StepRefused(exception.NotAuthorized):
    """A node-to-node step without the transfer's secret.

    Such a request came through the public API (a volume owner's
    connector), not from the other node's volume service.
    """

    message = _("Refusing the dmclone step %(op)s for volume %(volume)s: "
                "%(reason)s.")


class SourceStillInUse(exception.VolumeBackendAPIException):
    """The source's copy is still open: an instance there may write.

    The source's attachment was deleted while the volume stays open on
    its node (an owner's ``attachment delete`` during a live migration,
    say).  Committing would hydrate the destination from a copy that
    still changes and then retire it, losing what was written since.
    """

    message = _("Volume %(volume)s is still open on node %(node)s "
                "(%(users)d user(s) besides its iSCSI export): an instance "
                "there may still write to it, so its move is not "
                "committed. Detach it from that instance first, then "
                "delete the attachment again.")


class MigrationStarting(exception.VolumeIsBusy):
    """A local attach while a migration of the volume is being started.

    The migration has checked that no attachment exists and has not yet
    recorded its move: a path handed out now would be to the copy that
    the move is about to read and retire.
    """

    message = _("Volume %(volume_name)s is moving from node %(node)s (a "
                "migration of it is starting): %(action)s is possible once "
                "it has finished.")


class SourceUnreachable(exception.VolumeBackendAPIException):
    """The destination cannot log in to the source's export of a volume.

    Its source node or service is down, or has not exported the volume
    again since it rebooted: what only that node can fix, unlike a
    rebuild that fails here (a lost metadata LV).
    """

    message = _("Cannot reach the export of volume %(volume)s on node "
                "%(node)s: %(reason)s")


class VolumeNotMovable(exception.InvalidVolume):
    """The volume is written or read on its node without an attachment.

    An image being written to it (``downloading``: Cinder lets Nova
    reserve such a volume), a backup being restored to it or taken of
    it, an image being uploaded from it: the copy on its node is in use
    by its own volume service, which no attachment shows, so it must not
    move (a move copies from it, or skips the regions it has not written
    yet, and then retires it).  Also a migration of a volume that an
    attachment uses.
    """

    message = _("Volume %(volume)s cannot move from node %(node)s now: "
                "%(reason)s. Try again once it is available.")


class LostCopyHere(exception.VolumeBackendAPIException):
    """A node still holds the old copy of an abandoned move of the volume.

    Its move away from that node was ended as if the node were lost
    (``cinder-dmclone move abandon-source``); the old LV left there may
    hold the only copy of the regions never copied.  A move of the volume
    back to that node would replace (and wipe) it: refused until an
    operator removed it by hand.
    """

    message = _("Volume %(volume)s cannot move to node %(node)s: that node "
                "still holds LV %(lv)s, the old copy left there when the "
                "volume's move away from %(node)s was abandoned as lost "
                "(%(at)s). It may hold the only copy of the regions never "
                "copied (admin metadata dmclone_lost_ranges; all of them in "
                "%(file)s on the node the volume moved to). Copy what is "
                "needed from it, remove it by hand on %(node)s (see \"If "
                "the lost node comes back\" in the operations guide), then "
                "try again.")


class StrayCopyHere(exception.VolumeBackendAPIException):
    """A node holds a data LV of the volume that no move built.

    The LV has no dm-clone metadata LV beside it, so it is no leftover of
    an earlier attempt to move the volume there: it is an old copy (most
    likely of a move away from that node abandoned as lost, whose loss
    record a later abandon replaced).  A move there would wipe it.
    """

    message = _("Volume %(volume)s cannot move to node %(node)s: that node "
                "holds LV %(lv)s, named like the volume's LV but without "
                "the metadata LV %(meta)s a move builds first, so no move "
                "there made it. It is an old copy of the volume (its move "
                "away from %(node)s abandoned as lost, even if the admin "
                "metadata dmclone_lost_* now describe a later one; or a "
                "move to %(node)s rolled back after its metadata LV was "
                "lost) and may hold the only copy of some regions. Copy "
                "what is needed from it, remove it by hand on %(node)s "
                "(see \"If the lost node comes back\" in the operations "
                "guide), then try again.")


class LVMUnlisted(exception.VolumeBackendAPIException):
    """LVM could not list a volume group: nothing in it is known absent.

    (Brick's get_volume reads 'Volume group "X" not found', a PV not
    scanned yet after a reboot, as "no such LV".)  A step that would
    roll back, retire, wipe or give up a copy on an LV's absence is not
    taken; the move is kept as it is and looked at again later.
    """

    message = _("LVM cannot list volume group %(vg)s now (%(reason)s): "
                "no LV of it is taken as absent, and nothing is done that "
                "an absent LV would allow until it can")


class StepUnlisted(LVMUnlisted):
    """A step on a volume is refused while LVM cannot list a group here.

    What the step decides rests on which of the volume's LVs this node
    holds (an old copy to keep, a partly copied LV only its clone may
    serve, a clone's LVs to remove and wipe before the source's copy
    goes): it is not taken, nothing is changed, and it may be taken
    again once LVM lists the group.
    """

    message = _("Volume %(volume)s: %(step)s is refused on node %(node)s "
                "for now. LVM cannot list volume group %(vg)s there "
                "(%(reason)s), so which LVs of the volume that node holds "
                "cannot be told; nothing was changed. Once LVM lists the "
                "group again (a PV scanned late after a reboot: check with "
                "'vgs %(vg)s' on %(node)s), try again.")

    @classmethod
    def of(cls, unlisted, volume, node, step):
        """``step`` on ``volume`` at ``node``, refused for ``unlisted``."""
        return cls(volume=volume, node=node, step=step,
                   vg=unlisted.kwargs['vg'],
                   reason=unlisted.kwargs['reason'])


class CloneMetadataLost(exception.VolumeBackendAPIException):
    """A clone's data LV is here, its metadata LV is not.

    The metadata says which regions hold writes made here; without it no
    clone may be built over the data LV again (one over a fresh, zeroed
    metadata LV would read every region from the source: the writes made
    here hidden, and overwritten once hydration runs), so the move can
    never commit.
    """

    message = _("The clone of volume %(volume)s on node %(node)s cannot be "
                "built again: its metadata LV %(meta)s is gone, so which "
                "regions of LV %(lv)s hold writes made there is unknown. "
                "The move cannot commit; detaching the volume on %(node)s "
                "rolls it back to its source, keeping LV %(lv)s for an "
                "operator.")


class NodeLocalCoordination(exception.InvalidConfigurationValue):
    """The coordination backend's locks hold on one node only.

    Every step of a move runs under the volume's coordination lock, taken
    by the volume services of both nodes: with Cinder's default
    ``file://`` backend (or another node-local one) each node has its own
    lock, and a destination may tear down a clone its source is about to
    commit.
    """

    message = _("[coordination] backend_url = %(value)r keeps locks on "
                "this node only. The volume services of all nodes of this "
                "backend must share one coordination backend (etcd3, "
                "Redis, ZooKeeper...): the two nodes of a move serialise "
                "their steps with its lock, and with per-node locks a "
                "destination can remove a clone its source is committing, "
                "losing the volume's data. Set the same shared "
                "backend_url in the [coordination] section of cinder.conf "
                "on every node.")


class PartNotRecorded(exception.VolumeBackendAPIException):
    """This node could not mark the move it is to take part in.

    (:mod:`cinder_dmclone.evidence`.)  The mark is what keeps a stale save
    of the volume's record from steering this node later: the part is
    not taken, before anything is made for it.
    """

    message = _("This node cannot take part in the move of volume "
                "%(volume)s: its mark of the move could not be written "
                "(%(reason)s). Check that the service's state directory "
                "(<state_path>/dmclone) is writable; nothing was made for "
                "the move.")


class MoveContradicted(exception.VolumeBackendAPIException):
    """The move recorded contradicts this node's own mark of its move.

    (:mod:`cinder_dmclone.evidence`.)  A stale whole save of the volume's
    admin metadata replaced the record of the move this node takes part
    in: a step the record alone would allow (a teardown, a give-up, a
    rollback, a retire, a wipe, a linear mapping) is not taken.
    """

    message = _("Volume %(volume)s: %(step)s is not taken here. Its move "
                "record (%(record)s) contradicts this node's own mark: it "
                "is the %(part)s, which still holds its data here (a stale "
                "copy of the admin metadata saved whole?). Nothing was "
                "removed; see the operations guide.")


class AbortRefused(exception.VolumeBackendAPIException):
    """An abort of a move into this node that was committed.

    Authenticated by this node's mark alone (the record names another
    move: :mod:`cinder_dmclone.evidence`), it would remove the clone of a
    move the volume record names this node the destination of: the
    volume itself.  Nothing is removed.
    """

    message = _("Volume %(volume)s: the abort of its move from %(src)s "
                "is refused here: the volume record names this node, so "
                "the move was committed and its clone here is the "
                "volume. Nothing was removed.")
