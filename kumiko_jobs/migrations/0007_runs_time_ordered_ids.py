# New runs get time-ordered ids (UUID version 7, run_ids.py): the default changes, the column
# and the rows written so far do not (version 4 and 7 ids are both UUIDs and sort together).

from django.db import migrations, models

import kumiko_jobs.run_ids


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0006_runs_fewer_indexes"),
    ]

    operations = [
        migrations.AlterField(
            model_name="jobrun",
            name="id",
            field=models.UUIDField(
                default=kumiko_jobs.run_ids.new_run_id, editable=False, primary_key=True, serialize=False
            ),
        ),
    ]
