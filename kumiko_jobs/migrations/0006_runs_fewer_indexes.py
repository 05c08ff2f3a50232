# Every insert and every status change of a run writes each of its indexes: the job id keeps
# its uniqueness as a constraint (without the LIKE-pattern index unique=True adds on
# PostgreSQL), and retry_of is indexed only where it is set.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("kumiko_jobs", "0005_runs_results_history_console"),
    ]

    operations = [
        # The constraint first: the job id is never without a unique index.
        migrations.AddConstraint(
            model_name="jobrun",
            constraint=models.UniqueConstraint(fields=("job_id",), name="kj_run_job_id_unique"),
        ),
        migrations.AlterField(
            model_name="jobrun",
            name="job_id",
            field=models.CharField(max_length=100),
        ),
        migrations.AlterField(
            model_name="jobrun",
            name="retry_of",
            field=models.UUIDField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="jobrun",
            index=models.Index(
                condition=models.Q(("retry_of__isnull", False)), fields=["retry_of"], name="kj_run_retry_of"
            ),
        ),
    ]
