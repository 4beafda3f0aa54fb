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


class DMSetupCommandFailed(exception.VolumeBackendAPIException):
    """A dmsetup (or blockdev) command failed."""

    message = _("%(command)s failed: %(reason)s")


class DMStatusParseError(exception.VolumeBackendAPIException):
    """The kernel reported a status or table line we cannot interpret."""

    message = _("Cannot parse device-mapper output %(line)r: %(reason)s")


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


class StepRefused(exception.NotAuthorized):
    """A node-to-node step without the transfer's secret.

    Such a request came through the public API (a volume owner's
    connector), not from the other node's volume service.
    """

    message = _("Refusing the dmclone step %(op)s for volume %(volume)s: "
                "%(reason)s.")
