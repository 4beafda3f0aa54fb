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

"""In-memory stand-ins for the kernel, for fast unit tests.

The real kernel is exercised by the functional suite in the testbed; these
fakes keep the driver's unit tests about the driver's decisions.
"""

from cinder_dmclone import dmsetup
from cinder_dmclone import exception


class FakeDMSetup(object):
    """Device-mapper devices as a dict, behind DMSetup's interface.

    Tables go through the real builders' validation (format_table), and the
    calls are recorded in ``calls`` for ordering assertions.
    """

    def __init__(self, sizes=None, targets=None):
        self.devices = {}
        self.uuids = {}
        self.suspended = set()
        self.sizes = dict(sizes or {})
        self.target_types = dict(targets or {'linear': 'v1.4.0',
                                             'clone': 'v1.0.0'})
        self.calls = []
        self.fail_on = {}

    def _call(self, op, *args):
        self.calls.append((op,) + args)
        if op in self.fail_on:
            raise self.fail_on[op]

    def _require(self, name):
        if name not in self.devices:
            raise exception.DMSetupCommandFailed(
                command='dmsetup %s' % name, reason='No such device')

    def create(self, name, segments, uuid):
        self._call('create', name)
        dmsetup.validate_name(name)
        if name in self.devices:
            raise exception.DMSetupCommandFailed(
                command='dmsetup create %s' % name,
                reason='Device or resource busy')
        dmsetup.format_table(segments)
        self.devices[name] = list(segments)
        self.uuids[name] = uuid

    def load(self, name, segments):
        self._call('load', name)
        self._require(name)
        dmsetup.format_table(segments)
        self._inactive = (name, list(segments))

    def suspend(self, name, flush=True):
        self._call('suspend', name)
        self._require(name)
        self.suspended.add(name)

    def resume(self, name):
        self._call('resume', name)
        self._require(name)
        inactive = getattr(self, '_inactive', None)
        if inactive and inactive[0] == name:
            self.devices[name] = inactive[1]
            self._inactive = None
        self.suspended.discard(name)

    def reload(self, name, segments):
        self.load(name, segments)
        self.suspend(name)
        self.resume(name)

    def remove(self, name, retry=True):
        self._call('remove', name)
        self.devices.pop(name, None)
        self.uuids.pop(name, None)

    def rename(self, name, new_name):
        self._call('rename', name, new_name)
        self._require(name)
        self.devices[new_name] = self.devices.pop(name)
        self.uuids[new_name] = self.uuids.pop(name)

    def exists(self, name):
        return name in self.devices

    def table(self, name):
        self._call('table', name)
        self._require(name)
        return list(self.devices[name])

    def status(self, name):
        self._require(name)
        return [dmsetup.StatusLine(s.start, s.length, s.target, '')
                for s in self.devices[name]]

    def clone_statuses(self):
        self._call('clone_statuses')
        return {}

    def targets(self):
        self._call('targets')
        return dict(self.target_types)

    def version(self):
        self._call('version')
        return 'Library version: 1.02.185'

    def device_sectors(self, device):
        self._call('device_sectors', device)
        return self.sizes.get(device, 2097152)
