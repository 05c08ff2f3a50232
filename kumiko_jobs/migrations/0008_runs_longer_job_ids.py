# Job id columns widen from 100 to 255 characters (models.JOB_ID_LENGTH): with a long
# QUEUE_PREFIX a fan-out child's id did not fit. On PostgreSQL a varchar that only grows is
# changed in place (no table rewrite, the indexes stay).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0007_runs_time_ordered_ids"),
    ]

    operations = [
        migrations.AlterField(
            model_name="jobrun",
            name="fanout_of",
            field=models.CharField(blank=True, default="", max_length=255),
        ),
        migrations.AlterField(
            model_name="jobrun",
            name="fanout_parent",
            field=models.CharField(blank=True, default="", max_length=255),
        ),
        migrations.AlterField(
            model_name="jobrun",
            name="job_id",
            field=models.CharField(max_length=255),
        ),
    ]
