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

"""Paste filter of the testbed's cinder-api: a default noauth token.

The ``openstack`` CLI discovers the API version without a token, and
Cinder's noauth middleware answers such a request with an empty 204.
Requests without ``X-Auth-Token`` get ``admin:admin`` here, before noauth
sees them, so discovery returns the real version document.  Testbed only.
"""


class DefaultToken(object):
    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        environ.setdefault('HTTP_X_AUTH_TOKEN', 'admin:admin')
        return self.app(environ, start_response)


def filter_factory(global_conf, **local_conf):
    return DefaultToken
