from django.contrib import admin
from django.urls import include, path

from craft import views
from craft.api import going_back, preview, repository, search, sessions, workspace
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
    path("api/sessions/", sessions.sessions, name="api_sessions"),
    path("api/sessions/<uuid:session_id>/", sessions.session_detail, name="api_session"),
    path(
        "api/sessions/<uuid:session_id>/events/", sessions.session_events, name="api_session_events"
    ),
    path(
        "api/sessions/<uuid:session_id>/events/<int:seq>/",
        sessions.session_event,
        name="api_session_event",
    ),
    path("api/search/", search.sessions, name="api_search"),
    path("api/sessions/<uuid:session_id>/search/", search.in_session, name="api_session_search"),
    path("api/sessions/<uuid:session_id>/files/", workspace.files, name="api_files"),
    path("api/sessions/<uuid:session_id>/files/raw", workspace.raw, name="api_file_raw"),
    path("api/sessions/<uuid:session_id>/archive", workspace.archive, name="api_archive"),
    path(
        "api/sessions/<uuid:session_id>/turns/<int:seq>/diff/",
        workspace.turn_diff,
        name="api_turn_diff",
    ),
    path(
        "api/sessions/<uuid:session_id>/turns/<int:seq>/revert/",
        workspace.revert,
        name="api_turn_revert",
    ),
    path(
        "api/sessions/<uuid:session_id>/repository/",
        repository.repository,
        name="api_repository",
    ),
    path(
        "api/sessions/<uuid:session_id>/repository/commit/",
        repository.commit,
        name="api_repository_commit",
    ),
    path(
        "api/sessions/<uuid:session_id>/repository/push/",
        repository.push,
        name="api_repository_push",
    ),
    path(
        "api/sessions/<uuid:session_id>/repository/pull-request/",
        repository.pull_request,
        name="api_repository_pull_request",
    ),
    path(
        "api/sessions/<uuid:session_id>/repository/update/",
        repository.update,
        name="api_repository_update",
    ),
    path("api/sessions/<uuid:session_id>/preview/", preview.preview, name="api_preview"),
    path("api/sessions/<uuid:session_id>/fork/", going_back.fork, name="api_fork"),
    path("api/sessions/<uuid:session_id>/rewind/", going_back.rewind, name="api_rewind"),
    path("api/sandbox/", sessions.sandbox, name="api_sandbox"),
    path("api/agents/", sessions.agents, name="api_agents"),
    path("api/credentials/", sessions.credential_list, name="api_credentials"),
    path("api/credentials/<str:name>/", sessions.credential_detail, name="api_credential"),
    path("api/git-tokens/", sessions.git_token_list, name="api_git_tokens"),
    path("api/git-tokens/<str:host>/", sessions.git_token_detail, name="api_git_token"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
]
