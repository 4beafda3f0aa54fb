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

"""Removing an LV that held volume data, wiped, off the request path.

An old copy (the source's LV after a move, the destination's after a
rollback, an abort or a delete) must be cleared before its extents go to
the next LV of the group, another tenant's perhaps (``volume_clear``).
Clearing a large thick LV takes minutes, and the steps that remove one run
inside RPC calls bounded by ``dmclone_transfer_timeout``: a caller that
timed out would retry, and start another wipe of the same LV.  So the LV
is renamed at once (its name is free again and nothing maps it: a rename
is atomic in LVM's metadata), and wiped and removed in the background.  A
service that dies meanwhile finds the renamed LV at its next start and
wipes it again from the beginning.
"""

import secrets
import threading

from oslo_log import log as logging
from oslo_utils import units

from cinder_dmclone import dmsetup
from cinder_dmclone import layout

LOG = logging.getLogger(__name__)


def _spawn(fn, *args):
    """A background thread (a greenthread inside cinder-volume)."""
    thread = threading.Thread(target=fn, args=args, daemon=True,
                              name='dmclone-wipe')
    thread.start()
    return thread


class Wiper(object):
    """Discards LVs of one volume group.

    ``wipe(path, size_mb)`` clears a device (None when nothing needs
    clearing: ``volume_clear = none``, or thin LVs, which the pool hands
    out zeroed); ``dm`` reads a device's size.  ``lv_names()`` lists the
    group's LVs as LVM itself does, raising LVMUnlisted when it cannot
    (see Clones.lv_names); without it brick's lookup decides, which
    takes a volume group not found for an LV not found.
    """

    def __init__(self, vg, dm, wipe=None, spawn=_spawn, lv_names=None):
        self.vg = vg
        self.dm = dm
        self.wipe = wipe
        self.lv_names = lv_names
        self._spawn = spawn
        self._busy = set()
        self._lock = threading.Lock()

    def discard(self, lv_name):
        """Remove ``lv_name`` (wiped first when clearing is configured).

        Returns at once; the name is free when it returns.  An LV LVM
        does not list is gone already; a group LVM cannot list raises
        LVMUnlisted, nothing done: the caller's step fails and is tried
        again, rather than leave an old copy unwiped for good (a
        source's retire after a reboot, before its PV is scanned).
        """
        if not self._present(lv_name):
            return
        if self.wipe is None:
            self.vg.delete(lv_name)
            return
        retiring = layout.retiring_lv_name(lv_name, secrets.token_hex(4))
        self.vg.rename_volume(lv_name, retiring)
        LOG.info('LV %(lv)s renamed %(new)s; wiping and removing it in the '
                 'background.', {'lv': lv_name, 'new': retiring})
        self._submit(retiring)

    def _present(self, lv_name):
        if self.lv_names is None:
            return self.vg.get_volume(lv_name) is not None
        return lv_name in self.lv_names()

    def resume(self):
        """Wipe again what a stopped service left renamed (at start)."""
        for lv in self.vg.get_volumes():
            if layout.is_retiring_lv(lv['name']):
                LOG.warning('LV %s was being wiped when the service '
                            'stopped; wiping it again.', lv['name'])
                self._submit(lv['name'])

    def _submit(self, name):
        with self._lock:
            if name in self._busy:
                return
            self._busy.add(name)
        self._spawn(self._run, name)

    def _run(self, name):
        try:
            if self.wipe is None:
                # Renamed while clearing was on; the operator has turned it
                # off since (volume_clear = none): removed as any LV now is.
                LOG.warning('Clearing is off now; removing LV %s without '
                            'wiping it.', name)
            else:
                path = layout.lv_device(self.vg.vg_name, name)
                self.vg.activate_lv(name)
                self.wipe(path, self.dm.device_sectors(path)
                          * dmsetup.SECTOR_SIZE // units.Mi)
            self.vg.delete(name)
            LOG.info('LV %s %s.', name,
                     'removed' if self.wipe is None else 'wiped and removed')
        except Exception:
            LOG.exception('Wiping LV %s failed; it stays, under this name, '
                          'until the next start of the volume service wipes '
                          'it again.', name)
        finally:
            with self._lock:
                self._busy.discard(name)
