from django.contrib import admin
from django.urls import include, path

from craft import (
    api,
    going_back_api,
    preview_api,
    repository_api,
    search_api,
    views,
    workspace_api,
)
from craft.http import health

urlpatterns = [
    path("healthz", health.alive, name="healthz"),
    path("readyz", health.ready, name="readyz"),
    path("", views.home, name="home"),
    path("sessions/new/", views.new_session, name="new_session"),
    path("sandbox/status/", views.sandbox_status, name="sandbox_status"),
    path("sessions/list/", views.session_list, name="session_list"),
    path("sessions/list/<uuid:session_id>/", views.session_list_item, name="session_list_item"),
    path("keys/", views.keys, name="keys"),
    path("keys/git/<str:host>/", views.store_git_token, name="store_git_token"),
    path("keys/git/<str:host>/delete/", views.delete_git_token, name="delete_git_token"),
    path("keys/<str:name>/", views.store_key, name="store_key"),
    path("keys/<str:name>/delete/", views.delete_key, name="delete_key"),
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
    path("api/search/", search_api.sessions, name="api_search"),
    path(
        "api/sessions/<uuid:session_id>/search/", search_api.in_session, name="api_session_search"
    ),
    path("api/sessions/<uuid:session_id>/files/", workspace_api.files, name="api_files"),
    path("api/sessions/<uuid:session_id>/files/raw", workspace_api.raw, name="api_file_raw"),
    path("api/sessions/<uuid:session_id>/archive", workspace_api.archive, name="api_archive"),
    path(
        "api/sessions/<uuid:session_id>/turns/<int:seq>/diff/",
        workspace_api.turn_diff,
        name="api_turn_diff",
    ),
    path(
        "api/sessions/<uuid:session_id>/turns/<int:seq>/revert/",
        workspace_api.revert,
        name="api_turn_revert",
    ),
    path(
        "api/sessions/<uuid:session_id>/repository/",
        repository_api.repository,
        name="api_repository",
    ),
    path(
        "api/sessions/<uuid:session_id>/repository/commit/",
        repository_api.commit,
        name="api_repository_commit",
    ),
    path(
        "api/sessions/<uuid:session_id>/repository/push/",
        repository_api.push,
        name="api_repository_push",
    ),
    path(
        "api/sessions/<uuid:session_id>/repository/pull-request/",
        repository_api.pull_request,
        name="api_repository_pull_request",
    ),
    path(
        "api/sessions/<uuid:session_id>/repository/update/",
        repository_api.update,
        name="api_repository_update",
    ),
    path("api/sessions/<uuid:session_id>/preview/", preview_api.preview, name="api_preview"),
    path("api/sessions/<uuid:session_id>/fork/", going_back_api.fork, name="api_fork"),
    path("api/sessions/<uuid:session_id>/rewind/", going_back_api.rewind, name="api_rewind"),
    path("api/sandbox/", api.sandbox, name="api_sandbox"),
    path("api/agents/", api.agents, name="api_agents"),
    path("api/credentials/", api.credential_list, name="api_credentials"),
    path("api/credentials/<str:name>/", api.credential_detail, name="api_credential"),
    path("api/git-tokens/", api.git_token_list, name="api_git_tokens"),
    path("api/git-tokens/<str:host>/", api.git_token_detail, name="api_git_token"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
]
