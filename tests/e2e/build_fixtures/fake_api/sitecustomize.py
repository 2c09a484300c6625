"""Installs the fake synthesizer API as morello_build.api (build-integration tests only)."""

import sys

import morello_fake_api

sys.modules["morello_build.api"] = morello_fake_api
import morello_build  # noqa: E402

morello_build.api = morello_fake_api
