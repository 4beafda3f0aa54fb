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

"""Names and sizes of what the driver keeps on a node (pure functions).

The name scheme, for a volume whose LV is ``<volume_group>/<lv>`` (Cinder's
``volume_name_template``, ``volume-<uuid>`` by default):

* handle: the device-mapper device ``dmclone-<vg>-<lv>``, with dashes in
  the VG name doubled as LVM does, e.g.
  ``/dev/mapper/dmclone-cinder--volumes-volume-<uuid>``.  Everything that
  uses the volume's data on this node (instances, image copies, exports)
  goes through it, so its path never changes when the mapping underneath
  does (a plain linear map over the LV, or a clone target while the volume
  is in transfer).  Naming the VG keeps the handles of several backends on
  one host (or of two testbed nodes sharing one kernel) apart, and tells
  each backend's monitor which clone targets are its own.
* metadata LV: ``<lv>-dmcmeta`` in the metadata volume group, present only
  while a transfer into this node is in flight.

The prefix and suffix are fixed: a leftover is recognisable after a crash,
by any node, without a database.
"""

import math
import re

from oslo_utils import units

from cinder_dmclone import dmsetup
from cinder_dmclone import exception

HANDLE_PREFIX = 'dmclone-'
HANDLE_UUID_PREFIX = 'DMCLONE-'
METADATA_SUFFIX = '-dmcmeta'
#: LVM's own rules for LV names, narrowed to what Cinder generates.
_LV_NAME_RE = re.compile(r'^[A-Za-z0-9+_.][A-Za-z0-9+_.-]{0,100}$')
MIN_METADATA_BYTES = 8 * units.Mi


def validate_lv_name(lv_name):
    """Return ``lv_name`` if safe for LVM and device-mapper, else raise."""
    if (not isinstance(lv_name, str) or not _LV_NAME_RE.fullmatch(lv_name)
            or lv_name in ('.', '..') or lv_name.startswith('snapshot')
            or lv_name.startswith('pvmove')):
        raise exception.InvalidDMName(
            value=lv_name, reason='not a valid logical volume name')
    return lv_name


def validate_vg_name(vg_name):
    """Return ``vg_name`` if safe for LVM and device-mapper, else raise."""
    if (not isinstance(vg_name, str) or not _LV_NAME_RE.fullmatch(vg_name)
            or vg_name in ('.', '..')):
        raise exception.InvalidDMName(
            value=vg_name, reason='not a valid volume group name')
    return vg_name


def handle_name(vg_name, lv_name):
    """Device-mapper name of the handle of the volume LV ``vg/lv``."""
    return dmsetup.validate_name('%s%s-%s' % (
        HANDLE_PREFIX, validate_vg_name(vg_name).replace('-', '--'),
        validate_lv_name(lv_name)))


#: the stand-in for a lost source (see lost_source_name)
LOST_SOURCE_PREFIX = 'dmcgone-'


def lost_source_name(vg_name, lv_name):
    """The ``error`` device that stands in for a move's lost source.

    ``cinder-dmclone move abandon-source`` puts it under the clone in
    place of the source's iSCSI disk for as long as it runs (see
    :mod:`cinder_dmclone.lost_source`); never a handle, so that nothing
    takes it for a volume.
    """
    return dmsetup.validate_name('%s%s-%s' % (
        LOST_SOURCE_PREFIX, validate_vg_name(vg_name).replace('-', '--'),
        validate_lv_name(lv_name)))


def handle_uuid(vg_name, lv_name):
    """The dm UUID of a handle: tools tell ours from LVM's (``LVM-``)."""
    return HANDLE_UUID_PREFIX + handle_name(vg_name, lv_name)


def handle_path(vg_name, lv_name):
    return dmsetup.device_path(handle_name(vg_name, lv_name))


def parse_handle(name):
    """(vg, lv) of a handle name, or None if it is not a handle."""
    if not name.startswith(HANDLE_PREFIX):
        return None
    rest = name[len(HANDLE_PREFIX):]
    vg = []
    i = 0
    while i < len(rest):
        if rest[i] == '-':
            if rest[i + 1:i + 2] != '-':
                break
            i += 1
        vg.append(rest[i])
        i += 1
    try:
        return (validate_vg_name(''.join(vg)),
                validate_lv_name(rest[i + 1:]))
    except exception.InvalidDMName:
        return None


def lv_name_from_handle(name, vg_name):
    """The LV a handle of volume group ``vg_name`` maps, or None."""
    parsed = parse_handle(name)
    if parsed is None or parsed[0] != vg_name:
        return None
    return parsed[1]


def metadata_lv_name(lv_name):
    return validate_lv_name(lv_name + METADATA_SUFFIX)


def lv_name_from_metadata_lv(name):
    """The volume LV a metadata LV belongs to, or None if not one of ours."""
    if not name.endswith(METADATA_SUFFIX):
        return None
    try:
        return validate_lv_name(name[:-len(METADATA_SUFFIX)])
    except exception.InvalidDMName:
        return None


#: marks an old copy being wiped (see cinder_dmclone.wiper)
RETIRING_MARK = '-dmcwipe-'
_RETIRING_RE = re.compile(r'^.+-dmcwipe-[0-9a-f]{8}$')


def retiring_lv_name(lv_name, token):
    """The name an LV takes while it is wiped before its removal."""
    return validate_lv_name('%s%s%s' % (lv_name, RETIRING_MARK, token))


def is_retiring_lv(name):
    return isinstance(name, str) and bool(_RETIRING_RE.fullmatch(name))


def export_portal(provider_location):
    """The primary portal of an iSCSI export's ``provider_location``.

    Cinder's iSCSI targets write it as ``<portal>[;<portal>...],<tid>
    <iqn> <lun>``, the primary portal (``target_ip_address``) first, as
    ``<address>:<port>`` with an IPv6 address in brackets
    (``volume_utils.sanitize_host``); the secondary portals
    (``target_secondary_ip_addresses``) follow it after a ``;``.  ''
    for none.
    """
    location = provider_location or ''
    return location.split(' ', 1)[0].split(',', 1)[0].split(';', 1)[0]


def export_iqn(provider_location):
    """The target IQN of an export's ``provider_location``; None if none.

    (Its second word: see :func:`export_portal`.)
    """
    words = (provider_location or '').split(' ')
    return words[1] if len(words) >= 2 else None


def lv_device(volume_group, lv_name):
    """The /dev path LVM gives an LV."""
    return '/dev/%s/%s' % (volume_group, validate_lv_name(lv_name))


def region_sectors(region_kb):
    """Region size in sectors from the KiB option, validated for the kernel.

    Raises InvalidTable when the size is not a power of two in range.
    """
    return dmsetup.validate_region_size(region_kb * units.Ki //
                                        dmsetup.SECTOR_SIZE)


def metadata_size_bytes(volume_bytes, region_bytes, reserve=2.0):
    """Size of the metadata LV for a clone of ``volume_bytes``.

    dm-clone keeps one bit per region in an on-disk bitset, plus
    persistent-data space maps and a superblock.  The bitmap is 32 MiB per
    TiB at 4 KiB regions, so the size must follow the volume: the bitmap
    times ``reserve`` for the metadata's own structures, rounded up to whole
    MiB, never less than 8 MiB.
    """
    if volume_bytes <= 0 or region_bytes <= 0:
        raise exception.InvalidTable(
            reason='volume and region sizes must be positive')
    regions = math.ceil(volume_bytes / region_bytes)
    bitmap_bytes = math.ceil(regions / 8)
    wanted = math.ceil(bitmap_bytes * reserve)
    wanted = math.ceil(wanted / units.Mi) * units.Mi
    return max(MIN_METADATA_BYTES, wanted)
