"""Name rules shared by every kind: DNS-1123 names, label keys and values, environment variables.

Plain functions raising ValueError; no pydantic, so the CLI's read path can use them cheaply.
"""

import re

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_dns_label(value: str) -> str:
    """Names of namespaced objects and namespaces: RFC 1123 labels, like Kubernetes."""
    if len(value) > 63 or not _DNS_LABEL.match(value):
        raise ValueError(
            f"{value!r} is not a valid name: use at most 63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return value


def check_dns_subdomain(value: str) -> str:
    """Names of nodes and other cluster objects: RFC 1123 subdomains (dots allowed)."""
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise ValueError(
            f"{value!r} is not a valid name: use lowercase letters, digits, '-' and '.', "
            "starting and ending with a letter or digit"
        )
    return value


def check_label_key(key: str) -> str:
    prefix, _, name = key.rpartition("/")
    if prefix:
        check_dns_subdomain(prefix)
    if len(name) > 63 or not _LABEL_NAME.match(name):
        raise ValueError(f"label key {key!r} is not valid: at most 63 of [A-Za-z0-9-_.]")
    return key


def check_label_value(value: str) -> str:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise ValueError(f"label value {value!r} is not valid: at most 63 of [A-Za-z0-9-_.]")
    return value


def check_env_name(value: str) -> str:
    if not _ENV_NAME.match(value):
        raise ValueError(f"{value!r} is not a valid environment variable name")
    return value
