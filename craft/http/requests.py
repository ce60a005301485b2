"""The request type of this app's views: Django's, with django-htmx's details."""

from django.contrib.auth.models import AnonymousUser, User
from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails


class AppRequest(HttpRequest):
    """A request that went through HtmxMiddleware and AuthenticationMiddleware."""

    htmx: HtmxDetails
    user: User | AnonymousUser


class SignedInRequest(AppRequest):
    """A request of a view behind `login_required`."""

    user: User
