from django.contrib import admin
from django.urls import include, path

from . import views

urlpatterns = [
    path("", views.home, name="home"),
    path("sessions/new/", views.new_session, name="new_session"),
    path("sessions/<uuid:session_id>/", views.session_page, name="session"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
]
