"""Search entries, how far each session is indexed, and the entries' full-text index: a GIN index of the text's `simple` tsvector on
PostgreSQL, an FTS5 table kept by triggers on SQLite (craft.storage.search)."""

from django.db import migrations, models
import django.db.models.deletion

POSTGRES = [
    (
        "CREATE INDEX craft_searchentry_fts ON craft_searchentry "
        "USING GIN (to_tsvector('simple', text))",
        "DROP INDEX IF EXISTS craft_searchentry_fts",
    ),
]
SQLITE = [
    (
        "CREATE VIRTUAL TABLE craft_searchentry_fts USING fts5("
        "text, content='craft_searchentry', content_rowid='id', tokenize='unicode61')",
        "DROP TABLE IF EXISTS craft_searchentry_fts",
    ),
    (
        "CREATE TRIGGER craft_searchentry_ai AFTER INSERT ON craft_searchentry BEGIN "
        "INSERT INTO craft_searchentry_fts(rowid, text) VALUES (new.id, new.text); END",
        "DROP TRIGGER IF EXISTS craft_searchentry_ai",
    ),
    (
        "CREATE TRIGGER craft_searchentry_ad AFTER DELETE ON craft_searchentry BEGIN "
        "INSERT INTO craft_searchentry_fts(craft_searchentry_fts, rowid, text) "
        "VALUES ('delete', old.id, old.text); END",
        "DROP TRIGGER IF EXISTS craft_searchentry_ad",
    ),
    (
        "CREATE TRIGGER craft_searchentry_au AFTER UPDATE ON craft_searchentry BEGIN "
        "INSERT INTO craft_searchentry_fts(craft_searchentry_fts, rowid, text) "
        "VALUES ('delete', old.id, old.text); "
        "INSERT INTO craft_searchentry_fts(rowid, text) VALUES (new.id, new.text); END",
        "DROP TRIGGER IF EXISTS craft_searchentry_au",
    ),
]


def _create(apps, schema_editor):
    for create, _ in {"postgresql": POSTGRES, "sqlite": SQLITE}.get(schema_editor.connection.vendor, []):
        schema_editor.execute(create)


def _drop(apps, schema_editor):
    for _, drop in reversed({"postgresql": POSTGRES, "sqlite": SQLITE}.get(schema_editor.connection.vendor, [])):
        schema_editor.execute(drop)


class Migration(migrations.Migration):
    dependencies = [("craft", "0012_git_repositories")]

    operations = [
        migrations.AddField(
            model_name="session",
            name="search_indexed_seq",
            field=models.PositiveBigIntegerField(default=0),
        ),
        migrations.CreateModel(
            name="SearchEntry",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("seq", models.PositiveBigIntegerField()),
                ("kind", models.CharField(choices=[("prompt", "Prompt"), ("reply", "Reply"), ("tool", "Tool")], max_length=8)),
                ("text", models.TextField()),
                ("session", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="search_entries", to="craft.session")),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("session", "seq"), name="search_entry_unique_seq")],
            },
        ),
        migrations.RunPython(_create, _drop),
    ]
