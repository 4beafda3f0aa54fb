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

"""attachments.may_be_on: what keeps a live migration's move in place."""

import types

from cinder.objects import fields
from cinder.tests.unit import test

from cinder_dmclone import attachments

S = fields.VolumeAttachStatus


def att(status, host=None, connector_host=None):
    return types.SimpleNamespace(
        attach_status=status, attached_host=host,
        connector={'host': connector_host} if connector_host else None)


class MayBeOnTestCase(test.TestCase):

    def assertOn(self, expected, *atts, node=('node-b', 'b-alias')):
        volume = {'volume_attachment': list(atts)}
        self.assertEqual(expected,
                         attachments.may_be_on(volume, node, list(atts)))

    def test_none(self):
        self.assertOn(False)

    def test_in_use_here_by_host_or_connector_or_alias(self):
        for status in (S.RESERVED, S.ATTACHING, S.ATTACHED):
            self.assertOn(True, att(status, host='node-b'))
            self.assertOn(True, att(status, connector_host='b-alias'))
        self.assertOn(True, att(S.ATTACHED, host='node-b'), node='node-b')

    def test_reserved_without_a_host_may_be_here(self):
        self.assertOn(True, att(S.RESERVED))

    def test_elsewhere_or_not_in_use(self):
        self.assertOn(False, att(S.ATTACHED, host='node-a'),
                      att(S.RESERVED, connector_host='node-c'))
        for status in (S.DETACHED, S.ERROR_DETACHING, S.ERROR_ATTACHING):
            self.assertOn(False, att(status, host='node-b'))
