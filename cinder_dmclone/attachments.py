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

"""A volume's attachments, as far as a move cares about them.

Whether an attach moves a volume, whether a detach commits or rolls back
a live migration, and what recovery does after a crash in the middle of
one all depend on which nodes have an attachment and in which status.
"""

from cinder import context
from cinder import objects
from cinder.objects import fields

#: attach statuses of an attachment that is being set up right now.
STARTING = (fields.VolumeAttachStatus.RESERVED,
            fields.VolumeAttachStatus.ATTACHING)
ACTIVE = (fields.VolumeAttachStatus.ATTACHED,
          fields.VolumeAttachStatus.ATTACHING)
#: attach statuses of an attachment whose connector may use an export.
IN_USE = (fields.VolumeAttachStatus.RESERVED,
          fields.VolumeAttachStatus.ATTACHING,
          fields.VolumeAttachStatus.ATTACHED)


def current(volume):
    """The volume's attachments as the database holds them now.

    The Volume object a manager hands over can predate the attachment
    being set up: Cinder's attachment create with a connector (what Nova
    does for the destination of a live migration) reserves the attachment
    after it loaded the volume.
    """
    return objects.VolumeAttachmentList.get_all_by_volume_id(
        context.get_admin_context(), volume['id'])


def is_instance_attach(volume, attachments=None):
    """True if an instance attachment of the volume is being set up.

    Only instances move volumes: cinder-backup, image upload and other
    attaches without an instance get an ordinary iSCSI export.
    ``attachments`` defaults to the ones the volume object carries.
    """
    return bool(starting(volume, attachments))


def starting(volume, attachments=None):
    """Ids of the instance attachments being set up."""
    if attachments is None:
        attachments = volume.volume_attachment or []
    return {a.id for a in attachments
            if a.instance_uuid and a.attach_status in STARTING}


def _host(attachment):
    """The host an attachment names (its connector's), or None."""
    return attachment.attached_host or \
        (attachment.connector or {}).get('host')


def _names(node):
    """A node name, or a set of them, as a set."""
    return {node} if isinstance(node, str) else set(node)


def _active_hosts(volume, attachments):
    """The host of each active attachment (None where none is named)."""
    if attachments is None:
        attachments = volume.volume_attachment or []
    return [_host(a) for a in attachments if a.attach_status in ACTIVE]


def on(volume, node, attachments=None):
    """Active attachments of the volume on ``node`` (a name or a set)."""
    names = _names(node)
    return sum(1 for host in _active_hosts(volume, attachments)
               if host in names)


def holding(volume, node, attachments=None):
    """Ids (sorted) of the active attachments on ``node`` (see :func:`on`)."""
    names = _names(node)
    if attachments is None:
        attachments = volume.volume_attachment or []
    return sorted(str(a.id) for a in attachments
                  if a.attach_status in ACTIVE and _host(a) in names)


def may_be_on(volume, node, attachments=None):
    """True if an attachment in use may be on ``node`` (a name or a set).

    In use: reserved, attaching or attached.  One that names no host yet
    (reserved, its connector not saved) may be anywhere, ``node`` too.
    """
    names = _names(node)
    if attachments is None:
        attachments = volume.volume_attachment or []
    return any(a.attach_status in IN_USE
               and (_host(a) is None or _host(a) in names)
               for a in attachments)


def elsewhere(volume, nodes, attachments=None):
    """The hosts of the active attachments on none of ``nodes`` (a set).

    Sorted, one per attachment.  An attachment that names no host counts
    (as None, listed last): it may be on any node.
    """
    hosts = [host for host in _active_hosts(volume, attachments)
             if host not in nodes]
    return sorted(hosts, key=lambda host: (host is None, host or ''))


def unnamed(volume, attachments=None):
    """True if an attachment in use names no initiator (yet).

    Cinder saves an attachment's connector only once the connection is
    made: until then, the initiator it uses is unknown.
    """
    if attachments is None:
        attachments = volume.volume_attachment or []
    return any(not (a.connector or {}).get('initiator')
               for a in attachments if a.attach_status in IN_USE)


def initiators(volume, attachments=None):
    """The iSCSI initiators (lowercase) the volume's attachments use.

    Those of the connectors of the attachments reserved, attaching or
    attached: the ACLs of the volume's export that serve them.
    """
    if attachments is None:
        attachments = volume.volume_attachment or []
    return {str((a.connector or {}).get('initiator')).lower()
            for a in attachments if a.attach_status in IN_USE
            and (a.connector or {}).get('initiator')}


def node_initiators(node):
    """The iSCSI initiators (lowercase) that ``node``'s connectors name.

    Those of the attachments on ``node`` (``attached_host``, the
    connector's host) of any volume, not detached: one initiator serves
    every iSCSI session of a node, so these are the ones an ACL made
    for that node admits.  Empty when no attachment there tells.
    """
    found = objects.VolumeAttachmentList.get_all_by_host(
        context.get_admin_context(), node)
    return {str((a.connector or {}).get('initiator')).lower()
            for a in found if (a.connector or {}).get('initiator')}
