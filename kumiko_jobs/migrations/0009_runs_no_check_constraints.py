# The run table's CHECK constraints go (models.JobRun.Meta says why): PostgreSQL rebuilt all
# seven for every INSERT and UPDATE of a run, ~20 us of the backend's CPU each time. The
# counters keep their meaning as validators; on PostgreSQL the columns stay integers, so only
# the constraints are dropped. SQLite cannot drop a constraint: it rebuilds the table for each
# of the seven operations (a copy of every row each time), as for any constraint change.

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0008_runs_longer_job_ids"),
    ]

    operations = [
        # The fields first: each drops its own column's check by introspection, and the
        # model's named constraints are still known then, so they are left to their operation.
        migrations.AlterField(
            model_name="jobrun",
            name="attempt",
            field=models.IntegerField(default=1, validators=[django.core.validators.MinValueValidator(1)]),
        ),
        migrations.AlterField(
            model_name="jobrun",
            name="defer_count",
            field=models.IntegerField(default=0, validators=[django.core.validators.MinValueValidator(0)]),
        ),
        migrations.AlterField(
            model_name="jobrun",
            name="fanout_count",
            field=models.IntegerField(
                blank=True, null=True, validators=[django.core.validators.MinValueValidator(0)]
            ),
        ),
        migrations.AlterField(
            model_name="jobrun",
            name="max_attempts",
            field=models.IntegerField(default=1, validators=[django.core.validators.MinValueValidator(0)]),
        ),
        migrations.RemoveConstraint(
            model_name="jobrun",
            name="kj_run_status_valid",
        ),
        migrations.RemoveConstraint(
            model_name="jobrun",
            name="kj_run_attempt_positive",
        ),
        migrations.RemoveConstraint(
            model_name="jobrun",
            name="kj_run_finished_has_time",
        ),
    ]
