from django.contrib import admin
from django.urls import include, path

from craft import api, health, views

urlpatterns = [
    path("healthz", health.alive, name="healthz"),
    path("readyz", health.ready, name="readyz"),
    path("", views.home, name="home"),
    path("sessions/new/", views.new_session, name="new_session"),
    path("sandbox/status/", views.sandbox_status, name="sandbox_status"),
    path("sessions/list/", views.session_list, name="session_list"),
    path("sessions/<uuid:session_id>/", views.session_page, name="session"),
    path("sessions/<uuid:session_id>/rename/", views.rename_session, name="rename_session"),
    path("sessions/<uuid:session_id>/delete/", views.delete_session, name="delete_session"),
    path("api/sessions/", api.sessions, name="api_sessions"),
    path("api/sessions/<uuid:session_id>/", api.session_detail, name="api_session"),
    path("api/sessions/<uuid:session_id>/events/", api.session_events, name="api_session_events"),
    path(
        "api/sessions/<uuid:session_id>/events/<int:seq>/",
        api.session_event,
        name="api_session_event",
    ),
    path("api/sandbox/", api.sandbox, name="api_sandbox"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
]
